#!/usr/bin/env bash
# Session 9, nvidia-h100-x1, carry [".whl"], second kernel call: the stage breakdown of the list-based forward,
# then the rest of its GPU tests (the first call's limit cut them after sieve at T 1,000).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
O=$OUT/k2; mkdir -p $O
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: kernels/support.py and its wiring)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
repo=$(pwd)
{ header "python3 benchmarks/support_breakdown.py --tokens 65536 --head-dim 32"
  timeout 100 python3 benchmarks/support_breakdown.py --tokens 65536 --head-dim 32; } > $O/breakdown_log.txt 2>&1
t() {  # t NAME SECONDS FILE EXPR
  local name=$1 secs=$2 file=$3 expr=$4
  { header "python3 -m pytest $file -m gpu -k \"$expr\" -q -s -p no:cacheprovider"
    (cd /tmp && timeout $secs python3 -m pytest $repo/$file -c $repo/pyproject.toml -m gpu -k "$expr" -q -s -p no:cacheprovider 2>&1 | grep -E "ERR|FLAGS|passed|failed|Error|error|assert|FAILED" | tail -150); } > $O/$name.txt 2>&1
}
t test_kernels2 300 tests/test_kernels.py "sparsemax or sieve or lists or no_grad"
t test_modules 140 tests/test_attention_cuda.py "entmax or sparsemax or sieve"
for f in $O/*.txt; do echo "== $f"; tail -60 $f; done > $OUT/summary.txt 2>&1
tar czf $OUT/k2.tar.gz -C $OUT k2 && rm -rf $O
ls -la $OUT
