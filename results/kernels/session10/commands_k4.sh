#!/usr/bin/env bash
# Session 10, nvidia-h100-x1, call k4: the TDA tests call k3's time limit cut (the module's fast path now runs
# the one-pass op), then the paper MQMTAR model's evaluation time at 65,536 tokens with TDA.
#   bash results/kernels/session10/commands_k4.sh k4 LIMIT_S
set -u
name=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
export PYTHONUNBUFFERED=1
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
cmd="python3 -m pytest $repo/tests/test_attention_cuda.py $repo/tests/test_kernels.py::test_tda_activity_map_is_exact -c $repo/pyproject.toml -m gpu -v -s -p no:cacheprovider -k tda --durations=10"
{ header "$cmd"; (cd /tmp && timeout $(( $(left) - 100 )) $cmd); echo "exit: $?"; } > $OUT/$name/test_log_tda_modules.txt 2>&1
cmd="python3 benchmarks/eval_time.py --attns softmax,tda --samples 20,20 --out $OUT/$name/eval"
{ header "$cmd"; timeout $(( $(left) - 5 )) $cmd; echo "exit: $?"; } > $OUT/$name/eval_time_log.txt 2>&1
ls -la $OUT/$name
