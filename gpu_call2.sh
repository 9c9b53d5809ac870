#!/usr/bin/env bash
# x4: GPUs 0-2 the Copy sweep (sieve-alg1, ASEntmax reruns); GPU 3 sieve-alg1's two long test shapes, then MQRAR probes
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index . 2>&1 | tail -2
export PYTHONUNBUFFERED=1 LENGTHBENCH_UNVERIFIED_KERNELS=1
repo=$(pwd); R=/tmp/gres; mkdir -p $R $OUT/logs
hdr() { echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"; echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; echo "command: $*"; }
LIMIT=${LIMIT:-540}
CUDA_VISIBLE_DEVICES=0,1,2 timeout $LIMIT lengthbench sweep --config sweeps/sieve_alg1_r3.toml --results $R --quiet > $OUT/logs/sweep.txt 2>&1 &
export CUDA_VISIBLE_DEVICES=3
if [ ! -e $R/tests_done ]; then
  K='alg1 and T4096'
  { hdr "pytest tests/test_kernels.py -m gpu -k '$K'"; cd /tmp && timeout 120 python3 -m pytest $repo/tests/test_kernels.py -c $repo/pyproject.toml -m gpu -q -s -p no:cacheprovider -k "$K"; cd $repo; } > $OUT/logs/test_log_alg1_T4096.txt 2>&1
  touch $R/tests_done
fi
P="lengthbench run --task mqrar --preset paper --train-samples 20000000 --max-multiplier 2 --eval-samples 200 --eval-every 1000 --quiet --results $R --resume"
pr() { local name=$1; shift; { hdr "$P $*"; timeout $((LIMIT-30)) $P "$@"; } >> $R/probe-$name.txt 2>&1 & }
pr softmax-rope-lr1e-3 --attn softmax --pe rope
pr softmax-rope-lr3e-4 --attn softmax --pe rope --lr 3e-4
pr softmax-rope-inline --attn softmax --pe rope --param layout=inline
pr sieve-alg1-none --attn sieve-alg1 --pe none
wait
cp $R/probe-*.txt $OUT/logs/; cp -r $R/logs $OUT/logs/sweep_workers 2>/dev/null; mkdir -p $OUT/runs; cp $R/runs/*.parquet $OUT/runs/ 2>/dev/null
tail -3 $OUT/logs/sweep.txt; tail -3 $OUT/logs/test_log_alg1_T4096.txt 2>/dev/null
for f in $OUT/logs/probe-*; do echo "== $f"; grep -E " step " $f | tail -3 | cut -c1-200; done
cd $OUT && tar czf all.tgz logs runs && rm -rf logs runs
