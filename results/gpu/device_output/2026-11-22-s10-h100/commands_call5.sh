#!/usr/bin/env bash
# Session 10, nvidia-h100-x1, carry [".whl"], call 5 on a fresh machine: lanes B and D again (MQRAR with two-token
# values first, then the seeds' MQRAR from its weights) with the first stage on the preset's 10K warm-up, which
# made lane A's curriculum work in call 4; stage 2 with 2.5M samples:
#   bash results/gpu/device_output/2026-11-22-s10-h100/commands_call5.sh call5 545
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
stage() {  # stage LOG args...: one run, resumed from its checkpoint, stopped at the deadline
  local name=$1; shift
  [ "$(left)" -gt 20 ] || return 1
  header "lengthbench run $* --results $R --quiet --resume" >> $OUT/$call/$name.txt
  timeout -s INT $(left) lengthbench run "$@" --results $R --quiet --resume >> $OUT/$call/$name.txt 2>&1
  local rc=$?; echo "exit: $rc" >> $OUT/$call/$name.txt; return $rc
}
runid() { lengthbench run "$@" --results $R --dry-run | head -1 | awk '{print $1}'; }
M4="--d-model 512 --layers 4 --heads 16 --ffn 1024"
P="--preset paper --lr 3e-4 --eval-samples 200"
ONE="--param key_tokens=1 --param value_tokens=1"
B1="--task mqrar --attn softmax --pe rope $P $M4 --train-samples 1280000 --max-multiplier 16 --param value_tokens=2"
D1="--task mqrar --attn softmax --pe rope $P --train-samples 1280000 --max-multiplier 16 --param value_tokens=2"
( stage B1 $B1 && stage B2 --task mqrar --attn softmax --pe rope $P $M4 --train-samples 2500000 --max-multiplier 1024 --init-from $(runid $B1) ) &
( stage D1 $D1 && stage D2 --task mqrar --attn softmax --pe rope $P --train-samples 2500000 --max-multiplier 1024 --init-from $(runid $D1) ) &
sleep 90; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
