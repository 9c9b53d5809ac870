#!/usr/bin/env bash
# Session 11, nvidia-h100-x1, carry [".whl"]. A curriculum over MQRAR's own layouts, after the CPU probe
# (results/init_probe/README.md, session 11: at n = 16 the seeds' layout is learned within 500 steps from a model
# trained on the inline layout, where from scratch it stays on the plateau for 20,000):
#   stage 1: MQRAR, layout=inline (each query answered in place), n_train 16
#   stage 2: MQRAR as the seeds write it (queries, <sep>, answers), n_train 16, from stage 1
#   stage 3: MQRAR as the seeds write it, n_train 64 (the seeds' task), from stage 2, evaluated to 1024x
# Calls 3-4: calls 1-2 learned only with --init torch (lane B), whose stage 3 was at 0.985 validation by step
# 5,000, so stage 3 here has 1.28M samples; seed 004's other mechanisms, a second softmax seed, and a control
# (the seeds' layout at n_train 16 from scratch).
# Lanes run side by side; each stage resumes from its checkpoint, and a finished stage is read from the store,
# so a second call on the same (warm) machine continues where the first stopped.
#   bash results/gpu/device_output/2026-11-23-s11-h100/commands_call5.sh call5 360
# Call 5 (the same warm machine as calls 3-4): the NoPE mechanisms learned the inline layout at n 16 (stage 1)
# but not the seeds' layout (stage 2). A named variant, not the seeds' task: the inline layout at n 64 from
# their stage 1, to 1024x (100 evaluation samples: Sieve takes about 2 s per sample there), for stick-breaking, Sieve and (for comparison) softmax + RoPE seed 1.
set -u
call=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
# A helper was editing kernels/entmax.py in the working tree while this ran: use main's (a4845cc) for training.
git show a4845cc:kernels/entmax.py > kernels/entmax.py || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
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
chain() {  # chain LANE common-args...: the three stages
  local lane=$1; shift
  local S1="--task mqrar $* --train-length 16 --param layout=inline --train-samples 1280000 --max-multiplier 2"
  local S2="--task mqrar $* --train-length 16 --train-samples 640000 --max-multiplier 2"
  local S3="--task mqrar $* --train-samples 1280000 --max-multiplier 1024"
  stage ${lane}1 $S1 || return 1; local ID1; ID1=$(runid $S1)
  stage ${lane}2 $S2 --init-from $ID1 || return 1; local ID2; ID2=$(runid $S2 --init-from $ID1)
  stage ${lane}3 $S3 --init-from $ID2
}
P="--preset paper --eval-samples 200 --init torch"
inline() {  # inline LANE args...: stage 1 (already in the store here), then the inline layout at n 64
  local lane=$1; shift
  local S1="--task mqrar $* --train-length 16 --param layout=inline --train-samples 1280000 --max-multiplier 2"
  local ID1; ID1=$(runid $S1)
  [ -f $R/checkpoints/$ID1/model.pt ] || { echo "no weights for $ID1" > $OUT/$call/${lane}4.txt; return 1; }
  stage ${lane}4 --task mqrar $* --param layout=inline --train-samples 1280000 --max-multiplier 1024 --init-from $ID1 \
    --eval-samples 100
}
inline F --attn stickbreaking --pe none $P &
inline G --attn sieve --pe none $P &
inline I --attn softmax --pe rope $P --seed 1 &
sleep 60; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
