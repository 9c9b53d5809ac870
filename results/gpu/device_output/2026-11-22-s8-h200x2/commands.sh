#!/usr/bin/env bash
# Session 8, nvidia-h200-x2: run from the repository root with the wheel folder carried (device tool: carry [".whl"]),
# as `bash gpu_s8.sh call1 540` then, on the same warm machine, `bash gpu_s8.sh call2 420` (a first call 1 without the
# carry failed at the wheel install in 1 s). Code: commit 8ca29e3 plus this script.
set -u
call=$1; limit=$2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONFAULTHANDLER=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
cp -n results/gpu/runs/*.parquet $R/runs/  # cells already measured count as done
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
deadline=$(( $(date +%s) + limit ))
chain() {  # chain NAME cfg...: sweeps one after another on both GPUs, 3 cells per GPU, stopped at the common deadline
  local name=$1; shift
  ( for cfg in "$@"; do
      left=$(( deadline - $(date +%s) )); [ $left -lt 30 ] && break
      header "lengthbench sweep --config $cfg --per-gpu 3 --results $R --quiet"
      timeout -s INT $left lengthbench sweep --config $cfg --per-gpu 3 --results $R --quiet; echo "exit: $?"
    done ) > $OUT/$call/$name.txt 2>&1 &
}
chain chainA sweeps/p3_2back.toml sweeps/p3_flipflop_sparse.toml sweeps/p3_passkey.toml
chain chainB sweeps/p3_localcount.toml sweeps/p3_maxretrieval.toml sweeps/p3_flipflop_dense.toml
sleep 90; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $R/checkpoints/*; do [ -d "$f" ] && ls -la "$f" >> $OUT/$call/checkpoints.txt; done
ls -la $R/runs > $OUT/summary-$call.txt 2>&1
for f in $OUT/$call/*.txt; do echo "== $f"; tail -25 $f; done >> $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
