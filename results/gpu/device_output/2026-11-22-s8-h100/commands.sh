#!/usr/bin/env bash
# Session 8, nvidia-h100-x1, carry [".whl"]: callA 555 and callB 545 back to back on one warm machine, callC 545 on a
# fresh one (the first had been held 27 minutes). Code: commit 8ca29e3 plus this script.
# Session 8's H100 script, run from the repository root, two calls back to back on one warm machine:
#   bash gpu_s8h.sh callA 560   # GPU tests of ssmax/assmax's fast path, evaluation time of ssmax + NAPE, then cells
#   bash gpu_s8h.sh callB 560   # second seeds of cells far from the seed's numbers
#   bash gpu_s8h.sh callC 560   # (a third call, on a fresh machine) second seeds of more cells
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
sweep() {  # sweep NAME args...: one sweep in the background, stopped at the deadline
  local name=$1; shift
  ( header "lengthbench sweep $* --results $R --quiet"
    timeout -s INT $(( deadline - $(date +%s) )) lengthbench sweep "$@" --results $R --quiet; echo "exit: $?" ) \
    > $OUT/$call/$name.txt 2>&1 &
}
repo=$(pwd)
if [ "$call" = callA ]; then
  cmd="python3 -m pytest $repo/tests/test_attention_cuda.py -c $repo/pyproject.toml -m gpu -k ssmax_or_assmax -q -p no:cacheprovider"
  { header "$cmd (-k 'ssmax or assmax')"; (cd /tmp && timeout 150 python3 -m pytest $repo/tests/test_attention_cuda.py -c $repo/pyproject.toml -m gpu -k "ssmax or assmax" -q -p no:cacheprovider 2>&1 | tail -30); } > $OUT/$call/test_ssmax_log.txt 2>&1
  { header "python3 benchmarks/eval_time.py --pe nape --attns softmax,ssmax --samples 100,100 --out OUT/eval_nape"
    timeout 240 python3 benchmarks/eval_time.py --pe nape --attns softmax,ssmax --samples 100,100 --out $OUT/$call/eval_nape; } > $OUT/$call/eval_time_nape_log.txt 2>&1
  sweep dense --config sweeps/p3_flipflop_dense.toml --cells flipflop-dense:entmax:rope,flipflop-dense:asentmax:rope --per-gpu 2
  sweep sparse1 --config sweeps/p3_flipflop_sparse.toml --cells flipflop-sparse:asentmax:nape,flipflop-sparse:entmax:alibi --seeds 1 --per-gpu 2
elif [ "$call" = callC ]; then  # a fresh machine: second seeds of more cells far from the seed's numbers
  sweep clocal --config sweeps/p3_localcount.toml --cells localcount:softmax:rope,localcount:ssmax:rope,localcount:entmax:rope,localcount:asentmax:rope --seeds 1 --per-gpu 4
  sweep cdense --config sweeps/p3_flipflop_dense.toml --cells flipflop-dense:entmax:rope,flipflop-dense:asentmax:rope --seeds 1 --per-gpu 2
  sweep csparse --config sweeps/p3_flipflop_sparse.toml --cells flipflop-sparse:asentmax:rope --seeds 1 --per-gpu 1
  sweep cmax --config sweeps/p3_maxretrieval.toml --cells "maxretrieval:entmax(alpha=16):none" --seeds 1 --per-gpu 1
else
  # call A's cells, resumed from their checkpoints where the deadline cut them (skipped where finished)
  sweep dense --config sweeps/p3_flipflop_dense.toml --cells flipflop-dense:entmax:rope,flipflop-dense:asentmax:rope --per-gpu 2
  sweep sparse1 --config sweeps/p3_flipflop_sparse.toml --cells flipflop-sparse:asentmax:nape,flipflop-sparse:entmax:alibi --seeds 1 --per-gpu 2
  sweep b2back --config sweeps/p3_2back.toml --cells 2back:ssmax:rope,2back:entmax:rope,2back:asentmax:rope --seeds 1 --per-gpu 3
  sweep blocal --config sweeps/p3_localcount.toml --cells localcount:ssmax:nape --seeds 1 --per-gpu 1
fi
sleep 20; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; tail -25 $f; done > $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
