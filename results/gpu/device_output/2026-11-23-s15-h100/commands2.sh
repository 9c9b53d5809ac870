#!/usr/bin/env bash
# Session 15, second lease (nvidia-h100-x1, carry [".whl"]). The first lease (commands.sh, calls 1-3) trained both
# cells, but its machine was released between calls 2 and 3 (call 3 restarted both from step 0), before their
# scoring reached 512x: no rows. Here ASEntmax + NAPE seed 1 again, alone, beside the GPU tests of session 15's
# first stage (results/kernels/session15/commands.sh 1) in call 1; once its row is in the store, its trained
# model's evaluation time at 65,536 tokens and the first-stage benchmark (commands.sh v), alone on the GPU.
#   bash results/gpu/device_output/2026-11-23-s15-h100/commands2.sh callN SECONDS
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
args="--config sweeps/mqmtar_r6.toml --cells mqmtar:asentmax:nape --seeds 1"
if [ ! -f $R/sweep_done ]; then
  (header "lengthbench sweep $args --results $R --quiet" >> $OUT/$call/M.txt
   timeout -s INT $(( $(left) - 15 )) lengthbench sweep $args --results $R --quiet >> $OUT/$call/M.txt 2>&1
   status=$?; echo "exit: $status" >> $OUT/$call/M.txt; [ $status -eq 0 ] && touch $R/sweep_done) &
  lane=$!
  if [ ! -f $R/tests_done ]; then
    SKIP_INSTALL=1 bash results/kernels/session15/commands.sh 1 $(( $(left) - 30 )) > $OUT/$call/k1_stdout.txt 2>&1
    touch $R/tests_done
  fi
  wait $lane
fi
if [ -f $R/sweep_done ] && [ ! -f $R/eval_done ] && [ $(left) -gt 60 ]; then
  header "python3 benchmarks/eval_time.py --runs $R --attns asentmax:nape --samples 50" > $OUT/$call/eval_trained_log.txt
  timeout $(( $(left) - 20 )) python3 benchmarks/eval_time.py --runs $R --attns asentmax:nape --samples 50 \
    --out $OUT/$call/eval_trained >> $OUT/$call/eval_trained_log.txt 2>&1 && touch $R/eval_done
fi
if [ -f $R/eval_done ] && [ ! -f $R/v_done ] && [ $(left) -gt 120 ]; then
  SKIP_INSTALL=1 bash results/kernels/session15/commands.sh v $(( $(left) - 15 )) > $OUT/$call/kv_stdout.txt 2>&1
  touch $R/v_done
fi
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
for f in $R/logs/*.log; do echo "== $f"; tail -4 $f; done >> $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
cat $OUT/summary-$call.txt | cut -c1-220 | tail -45
