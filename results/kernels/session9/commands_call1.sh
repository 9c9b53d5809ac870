#!/usr/bin/env bash
# Session 9, nvidia-h100-x1, carry [".whl"]: the list-based forward of entmax, sparsemax and sieve
# (kernels/support.py): GPU tests, then the kernel benchmark and evaluation time, alone on the GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
O=$OUT/k; mkdir -p $O
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: kernels/support.py and its wiring)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
repo=$(pwd)
t() {  # t NAME SECONDS FILE -k EXPR
  local name=$1 secs=$2 file=$3 expr=$4
  { header "python3 -m pytest $file -m gpu -k \"$expr\" -q -s -p no:cacheprovider"
    (cd /tmp && timeout $secs python3 -m pytest $repo/$file -c $repo/pyproject.toml -m gpu -k "$expr" -q -s -p no:cacheprovider 2>&1 | grep -E "ERR|FLAGS|passed|failed|Error|error|assert|FAILED" | tail -150); } > $O/$name.txt 2>&1
}
t test_kernels 230 tests/test_kernels.py "entmax or sparsemax or sieve or registry or no_grad"
t test_modules 90 tests/test_attention_cuda.py "entmax or sparsemax or sieve"
{ header "python3 benchmarks/kernels.py --lengths 4096,65536 --head-dims 32,64 --mechanisms entmax,sparsemax,sieve --out OUT/bench"
  timeout 110 python3 benchmarks/kernels.py --lengths 4096,65536 --head-dims 32,64 --mechanisms entmax,sparsemax,sieve --out $O/bench; } > $O/bench_log.txt 2>&1
{ header "python3 benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms entmax,sieve --scale 0.1 --out OUT/bench_flat"
  timeout 50 python3 benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms entmax,sieve --scale 0.1 --out $O/bench_flat; } > $O/bench_flat_log.txt 2>&1
{ header "python3 benchmarks/eval_time.py --attns softmax,entmax --samples 40,10 --out OUT/eval_rope"
  timeout 55 python3 benchmarks/eval_time.py --attns softmax,entmax --samples 40,10 --out $O/eval_rope; } > $O/eval_rope_log.txt 2>&1
{ header "python3 benchmarks/eval_time.py --pe none --attns sieve --samples 10 --out OUT/eval_none"
  timeout 45 python3 benchmarks/eval_time.py --pe none --attns sieve --samples 10 --out $O/eval_none; } > $O/eval_none_log.txt 2>&1
for f in $O/*.txt; do echo "== $f"; tail -40 $f; done > $OUT/summary.txt 2>&1
tar czf $OUT/k.tar.gz -C $OUT k && rm -rf $O
ls -la $OUT
