#!/usr/bin/env bash
# Session 9, nvidia-h100-x1, carry [".whl"]: MQMTAR format controls for MQRAR on seed 003's MQMTAR model (call6):
# one call on a fresh machine:
#   bash gpu_s9t4.sh call6 420
# (paper preset, lr 3e-4, 2.5M samples, to 16x: MQMTAR with single-token keys and values, 12 pairs with filler, and 16 without)
set -u
call=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
cp -n results/gpu/runs/*.parquet $R/runs/ 2>/dev/null  # cells already measured count as done
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
left() { echo $(( deadline - $(date +%s) )); }
run() {  # run NAME args...: one cell in the background, resumed from its checkpoint, stopped at the deadline
  local name=$1; shift
  ( header "lengthbench run $* --results $R --quiet --resume"
    timeout -s INT $(left) lengthbench run "$@" --results $R --quiet --resume; echo "exit: $?" ) >> $OUT/$call/$name.txt 2>&1 &
}
sweep() {
  local name=$1; shift
  ( header "lengthbench sweep $* --results $R --quiet"
    timeout -s INT $(left) lengthbench sweep "$@" --results $R --quiet; echo "exit: $?" ) >> $OUT/$call/$name.txt 2>&1 &
}
P="--preset paper --lr 3e-4 --train-samples 2500000 --eval-samples 200 --max-multiplier 16 --d-model 512 --layers 4 --heads 16 --ffn 1024"
run fmtA --task mqmtar --attn softmax --pe rope $P --param key_tokens=1 --param value_tokens=1
run fmtB --task mqmtar --attn softmax --pe rope $P --param key_tokens=1 --param value_tokens=1 --param density=1.0
sleep 30; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; tail -25 $f; done > $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
