#!/usr/bin/env bash
# Session 13, last call (nvidia-h100-x1, carry [".whl"]): third seeds (seed 2) of the Priority 2 cells below the
# seed's row that are cheap enough for one call: Sort entmax + NAPE and ASEntmax + NAPE (r5, eager through the
# fused entmax op) and Copy ssmax + NAPE (r3), three lanes side by side on one H100. The main tree (this
# session's kernels) is installed.
#   bash results/gpu/device_output/2026-11-23-s13-h100/commands_seeds.sh seeds 540
set -u
call=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"
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
lane S --config sweeps/sort_r5.toml --cells sort:entmax:nape,sort:asentmax:nape --seeds 2 --per-gpu 2 &
lane C --config sweeps/copy_r3.toml --cells copy:ssmax:nape --seeds 2 &
sleep 120; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
for f in $R/logs/*.log; do echo "== $f"; tail -3 $f; done >> $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
