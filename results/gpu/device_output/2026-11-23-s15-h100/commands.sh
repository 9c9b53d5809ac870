#!/usr/bin/env bash
# Session 15 (nvidia-h100-x1, carry [".whl"]): second seeds of two MQMTAR cells of seed 003's Table 1 (r6,
# sweeps/mqmtar_r6.toml): entmax + RoPE (seed 0: 95.5 in distribution, 0 from 2x) and ASEntmax + NAPE (seed 0
# falls from 8x), side by side on one H100. Once both are in the store, the evaluation time at 65,536 tokens of
# their trained models (benchmarks/eval_time.py --runs), beside the untrained models' and softmax's, alone on
# the GPU. The sweep resumes from its checkpoints in /tmp/gres across calls on the same machine:
#   bash results/gpu/device_output/2026-11-23-s15-h100/commands.sh callN SECONDS
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
args="--config sweeps/mqmtar_r6.toml --cells mqmtar:entmax:rope,mqmtar:asentmax:nape --seeds 1 --per-gpu 2"
if [ ! -f $R/sweep_done ]; then
  header "lengthbench sweep $args --results $R --quiet" >> $OUT/$call/M.txt
  (sleep 120; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt) &
  timeout -s INT $(left) lengthbench sweep $args --results $R --quiet >> $OUT/$call/M.txt 2>&1
  status=$?; echo "exit: $status" >> $OUT/$call/M.txt
  [ $status -eq 0 ] && touch $R/sweep_done
fi
if [ -f $R/sweep_done ] && [ ! -f $R/eval_done ] && [ $(left) -gt 150 ]; then
  # Alone on the GPU: softmax (its time does not depend on the weights), the untrained models, the trained ones.
  header "python3 benchmarks/eval_time.py --attns softmax,entmax,asentmax:nape --samples 50,10,10" > $OUT/$call/eval_fresh_log.txt
  timeout $(( $(left) - 90 )) python3 benchmarks/eval_time.py --attns softmax,entmax,asentmax:nape --samples 50,10,10 \
    --out $OUT/$call/eval_fresh >> $OUT/$call/eval_fresh_log.txt 2>&1
  header "python3 benchmarks/eval_time.py --runs $R --attns entmax:rope,asentmax:nape --samples 50" > $OUT/$call/eval_trained_log.txt
  timeout $(( $(left) - 20 )) python3 benchmarks/eval_time.py --runs $R --attns entmax:rope,asentmax:nape --samples 50 \
    --out $OUT/$call/eval_trained >> $OUT/$call/eval_trained_log.txt 2>&1 && touch $R/eval_done
fi
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
for f in $R/logs/*.log; do echo "== $f"; tail -4 $f; done >> $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
cat $OUT/summary-$call.txt | cut -c1-220 | tail -40
