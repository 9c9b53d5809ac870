#!/usr/bin/env bash
# Session 16 (nvidia-h100-x1, carry [".whl"]): the second seeds of two MQMTAR cells of seed 003's Table 1 (r6,
# sweeps/mqmtar_r6.toml) that session 15 trained and lost with its machine: entmax + RoPE and ASEntmax + NAPE,
# side by side on one H100, in one chain of calls without gaps (the sweep resumes from its checkpoints in
# /tmp/gres, which only lives as long as the machine). Once both rows are in the store, the evaluation time at
# 65,536 tokens of the trained models (benchmarks/eval_time.py --runs) beside softmax's, alone on the GPU.
#   bash results/gpu/device_output/2026-11-23-s16-h100/commands.sh callN SECONDS [CELLS]
set -u
call=$1; limit=$2; cells=${3:-mqmtar:entmax:rope,mqmtar:asentmax:nape}
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
[ -f $R/started ] || date -u +%FT%TZ > $R/started
echo "state: started $(cat $R/started); $(ls $R/checkpoints 2>/dev/null | wc -l) checkpoints; flags: $(ls $R | grep done | tr '\n' ' ')"
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
left() { echo $(( deadline - $(date +%s) )); }
args="--config sweeps/mqmtar_r6.toml --cells $cells --seeds 1 --per-gpu 2"
if [ ! -f $R/sweep_done ]; then
  header "lengthbench sweep $args --results $R --quiet" >> $OUT/$call/M.txt
  (sleep 120; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt) &
  timeout -s INT $(( $(left) - 15 )) lengthbench sweep $args --results $R --quiet >> $OUT/$call/M.txt 2>&1
  status=$?; echo "exit: $status" >> $OUT/$call/M.txt
  [ $status -eq 0 ] && touch $R/sweep_done
fi
if [ -f $R/sweep_done ] && [ ! -f $R/eval_done ] && [ $(left) -gt 150 ]; then
  # Alone on the GPU: softmax (its time does not depend on the weights), then the trained models.
  header "python3 benchmarks/eval_time.py --attns softmax --samples 100" > $OUT/$call/eval_softmax_log.txt
  timeout $(( $(left) - 100 )) python3 benchmarks/eval_time.py --attns softmax --samples 100 \
    --out $OUT/$call/eval_softmax >> $OUT/$call/eval_softmax_log.txt 2>&1
  header "python3 benchmarks/eval_time.py --runs $R --attns ${cells//mqmtar:/} --samples 50" > $OUT/$call/eval_trained_log.txt
  timeout $(( $(left) - 20 )) python3 benchmarks/eval_time.py --runs $R --attns ${cells//mqmtar:/} --samples 50 \
    --out $OUT/$call/eval_trained >> $OUT/$call/eval_trained_log.txt 2>&1 && touch $R/eval_done
fi
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -12; done > $OUT/summary-$call.txt 2>&1
for f in $R/logs/*.log; do echo "== $f"; tail -4 $f; done >> $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
cat $OUT/summary-$call.txt | cut -c1-220 | tail -40
