#!/usr/bin/env bash
# Session 12, nvidia-h100-x1, carry [".whl"]. MQRAR (seed 004, priority 1), as sweeps of the product:
#   A: sweeps/mqrar_inline_c12.toml, the named variant "layout=inline at n 64" for the four mechanisms, seed 0
#   B: the same variant, Sieve + NoPE, seed 1 (session 11's Sieve stage 1 peaked at 69% and fell)
#   C: sweeps/mqrar_c11.toml (protocol c11), entmax + RoPE, seeds 1 and 2
#   D: sweeps/mqrar_c11.toml, softmax + RoPE, seed 2
# Call 8 (a fresh machine, the session's last device minutes): the inline variant's RoPE cells, seeds 1 and 2
# (sweeps/mqrar_inline_c12.toml), for the variant's best of three.
# Every sweep resumes what it has in the store (/tmp/gres) and each run from its checkpoint, so the next call on
# the same warm machine continues where this one stopped:
#   bash results/gpu/device_output/2026-11-23-s12-h100/commands_call8.sh call8 400
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
lane R --config sweeps/mqrar_inline_c12.toml --cells mqrar:softmax:rope,mqrar:entmax:rope --seeds 1,2 --per-gpu 4 &
sleep 150; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -15; done > $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
