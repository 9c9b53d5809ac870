#!/usr/bin/env bash
# Session 13, fourth call (nvidia-h100-x1, carry [".whl"]): tests/test_attention_cuda.py for the mechanisms whose
# kernels changed, alone on the GPU (in call 2, beside two training lanes and their 65,536-token evaluations,
# 11 of its cases failed with CUDA out of memory), then the list backward's and the kernels' tests once more.
#   bash results/kernels/session13/commands_retest.sh 400
set -u
limit=$1; deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
export PYTHONUNBUFFERED=1
R0=$PWD; O=$OUT/k4; mkdir -p $O
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
P="python3 -m pytest -c $R0/pyproject.toml -q -p no:cacheprovider -rfE -p no:benchmark"
{ header "$P -n 4 $R0/tests/test_attention_cuda.py -k 'sieve or entmax or sparsemax or stickbreaking'"
  (cd /tmp && timeout $(( $(left) - 60 )) $P -n 4 $R0/tests/test_attention_cuda.py -k "sieve or entmax or sparsemax or stickbreaking"); echo "exit: $?"; } > $O/test_log_attention_cuda.txt 2>&1
for f in $O/*.txt; do echo "== $f"; tail -n 8 $f; done
tar czf $OUT/k4.tar.gz -C $OUT k4 && rm -rf $O
