#!/usr/bin/env bash
# Session 10, nvidia-h100-x1: the one-pass TDA op's activity map (kernels/tda.py), GPU tests and launch variants.
#   bash results/kernels/session10/commands.sh NAME LIMIT_S
set -u
name=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
mkdir -p $OUT/$name
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
left() { echo $(( deadline - $(date +%s) )); }
cmd="python3 benchmarks/tda_variants.py --out $OUT/$name --head-dims 32"
{ header "$cmd"; timeout $(( $(left) - 200 )) $cmd; echo "exit: $?"; } > $OUT/$name/bench_d32_log.txt 2>&1
cmd="python3 -m pytest -q -s -m gpu tests/test_kernels.py -k tda_variants_match_reference or tda_activity_map -p no:cacheprovider"
{ header "$cmd"; timeout $(( $(left) - 15 )) python3 -m pytest -q -s -m gpu tests/test_kernels.py -k "tda_variants_match_reference or tda_activity_map" -p no:cacheprovider; echo "exit: $?"; } > $OUT/$name/test_log_variants.txt 2>&1
ls -la $OUT/$name
