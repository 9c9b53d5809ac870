#!/usr/bin/env bash
# Session 10, nvidia-h100-x1, call k2: the TDA op's new defaults (no skip branch; the activity map when a
# backward may follow; the module runs the op), its GPU tests and the variants at head dims 32 and 64.
#   bash results/kernels/session10/commands_k2.sh k2 LIMIT_S
set -u
name=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
mkdir -p $OUT/$name
repo=$(pwd)
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
left() { echo $(( deadline - $(date +%s) )); }
V=tda-2pass,main
cmd="python3 benchmarks/tda_variants.py --out $OUT/$name --head-dims 32,64 --variants $V"
[ "${SKIP_BENCH:-0}" = 1 ] || { header "$cmd"; timeout 170 $cmd; echo "exit: $?"; } > $OUT/$name/bench_log.txt 2>&1
# from /tmp, so that the installed package is tested (as benchmarks/gpu_checks.sh does)
cmd="python3 -m pytest $repo/tests/test_kernels.py $repo/tests/test_attention_cuda.py -c $repo/pyproject.toml -m gpu -q -s -p no:cacheprovider -k tda --durations=10"
{ header "$cmd"; (cd /tmp && timeout $(( $(left) - 10 )) $cmd); echo "exit: $?"; } > $OUT/$name/test_log_tda.txt 2>&1
ls -la $OUT/$name
