#!/usr/bin/env bash
# Session 10, nvidia-h100-x1, carry [".whl"], call 6 on a fresh machine: call 4's chain, then MQRAR from its
# single-token MQMTAR model (--init-part body: all but the embedding and output layer), seed 003's model size:
#   stage 1: two-token MQMTAR, 1.28M samples, the preset's 10K warm-up (call 4: 88% at 1x)
#   stage 2: single-token MQMTAR from stage 1, 640K samples (call 4 was at 98.9% validation by step 5,000)
#   stage 3: MQRAR from stage 2 (body), 1.28M samples, to 1024x
# Validation lines are logged as they come, so a call cut by the device budget still returns them.
#   bash results/gpu/device_output/2026-11-22-s10-h100/commands_call6.sh call6 520
set -u
call=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
# (no seeding from results/gpu/runs: stage 1 is call 4's run, whose weights must be trained here again)
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
A1="--task mqmtar --attn softmax --pe rope $P $M4 --train-samples 1280000 --max-multiplier 16"
A2="--task mqmtar --attn softmax --pe rope $P $M4 --train-samples 640000 --max-multiplier 16 $ONE"
( stage A1 $A1 && ID1=$(runid $A1) && stage A2 $A2 --init-from $ID1 && ID2=$(runid $A2 --init-from $ID1) \
  && cp $R/checkpoints/$ID2/model.pt $OUT/$call/stage2-model-$ID2.pt \
  && stage A3 --task mqrar --attn softmax --pe rope $P $M4 --train-samples 1280000 --max-multiplier 1024 --init-from $ID2 --init-part body ) &
sleep 90; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
mv $OUT/$call/*.pt $OUT/ 2>/dev/null; tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
