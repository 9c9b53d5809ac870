#!/usr/bin/env bash
# Session 14 (nvidia-h100-x1, carry [".whl"]): second seeds of two MQMTAR cells of seed 003's Table 1 (r6,
# sweeps/mqmtar_r6.toml): entmax + NAPE (seed 0 fell from 2x on) and ASEntmax + RoPE (seed 0 not learned),
# side by side on one H100, through the session's kernels (commit c5b7193 on). The sweep resumes from its
# checkpoints in /tmp/gres across calls on the same machine:
#   bash results/gpu/device_output/2026-11-23-s14-h100/commands.sh callN SECONDS
set -u
call=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
left() { echo $(( deadline - $(date +%s) )); }
lane() {  # lane NAME sweep-args...
  local name=$1; shift
  header "lengthbench sweep $* --results $R --quiet" >> $OUT/$call/$name.txt
  timeout -s INT $(left) lengthbench sweep "$@" --results $R --quiet >> $OUT/$call/$name.txt 2>&1
  echo "exit: $?" >> $OUT/$call/$name.txt
}
lane M --config sweeps/mqmtar_r6.toml --cells mqmtar:entmax:nape,mqmtar:asentmax:rope --seeds 1 --per-gpu 2 &
sleep 90; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
for f in $R/logs/*.log; do echo "== $f"; tail -4 $f; done >> $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
cat $OUT/summary-$call.txt | cut -c1-200 | tail -40
