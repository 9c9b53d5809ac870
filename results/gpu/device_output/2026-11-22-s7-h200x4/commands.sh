#!/usr/bin/env bash
# Session 7's device script (run from the repository root as gpu_x4.sh, not part of the repository): one call of
# the batch on 4 GPUs (nvidia-h200-x4), run three times back to back on one warm machine, resuming:
#   bash gpu_x4.sh call1 525; bash gpu_x4.sh call2 540; bash gpu_x4.sh call3 540 (568 s: the line below)
# Calls 1 and 2 ran the working tree before the tar step was added (only 8 files came back from each: call1/,
# call2/); call 3 returned everything, including every worker log (call3/logs/) and every run (results/gpu/runs/).
# Code: commit b724648 (the sweep files sweeps/p3_*.toml were untracked then, committed in session 7 unchanged).
set -u
call=$1; limit=$2
[ "$call" = call3 ] && limit=568  # the last call: as long as the 600 s call allows (install ~12 s, tar ~5 s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONFAULTHANDLER=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R $OUT/$call
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
go() {  # go GPU NAME command...
  local gpu=$1 name=$2; shift 2
  ( header "CUDA_VISIBLE_DEVICES=$gpu $*"; CUDA_VISIBLE_DEVICES=$gpu timeout -s INT $limit "$@"; echo "exit: $?" ) \
    > $OUT/$call/$name.txt 2>&1 &
}
MQ="--task mqrar --attn softmax --pe rope --preset paper --d-model 512 --layers 4 --heads 16 --ffn 1024 --eval-samples 200 --max-multiplier 1024 --results $R --resume --quiet"
go 0 mqrar-d512-lr3e-4 lengthbench run $MQ --lr 3e-4
go 0 mqrar-d512-lr3e-4-torchinit lengthbench run $MQ --lr 3e-4 --init torch
go 1 mqmtar-entmax-nape lengthbench sweep --config sweeps/mqmtar_r6.toml --cells mqmtar:entmax:nape,mqmtar:asentmax:nape --results $R --quiet
go 2 mqmtar-entmax-rope lengthbench sweep --config sweeps/mqmtar_r6.toml --cells mqmtar:entmax:rope,mqmtar:asentmax:rope --results $R --quiet
deadline=$(( $(date +%s) + limit ))
chain() {  # chain GPU NAME cfg...: sweeps one after another, each stopped at the common deadline
  local gpu=$1 name=$2; shift 2
  ( for cfg in "$@"; do
      left=$(( deadline - $(date +%s) )); [ $left -lt 30 ] && break
      header "CUDA_VISIBLE_DEVICES=$gpu lengthbench sweep --config $cfg --results $R --quiet"
      CUDA_VISIBLE_DEVICES=$gpu timeout -s INT $left lengthbench sweep --config $cfg --results $R --quiet; echo "exit: $?"
    done ) > $OUT/$call/$name.txt 2>&1 &
}
chain 3 reverse-p3 sweeps/reverse_r5.toml sweeps/p3_2back.toml sweeps/p3_flipflop_sparse.toml sweeps/p3_localcount.toml sweeps/p3_flipflop_dense.toml
sleep 60; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $R/checkpoints/*; do [ -d "$f" ] && ls -la "$f" >> $OUT/$call/checkpoints.txt; done
ls -la $R/runs $OUT/$call > $OUT/summary-$call.txt 2>&1
for f in $OUT/$call/*.txt; do echo "== $f"; tail -4 $f; done >> $OUT/summary-$call.txt 2>&1
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
