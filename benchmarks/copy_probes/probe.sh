#!/usr/bin/env bash
# One CPU probe of Copy + NoPE at a small scale (REPRODUCTION.md, session 31): n_train 16 (lengths 8-16), the seeds'
# 2 layers with d 128 and 8 heads, 500K samples of batch 64 (7,813 steps, lr 1e-3), selection at 8x, scored to 8x
# on 100 samples. About 5 minutes on 2 cores. It fails as the GPU models at n_train 64 do (100% in distribution,
# 0 from 2x, token accuracy 60-69% at 2x and 30-34% at 4x), so a change that makes it extrapolate is worth a GPU run.
# Usage, from the repository root with lengthbench installed:
#   bash benchmarks/copy_probes/probe.sh ATTN [extra lengthbench-run args]
#   e.g. bash benchmarks/copy_probes/probe.sh sb-drop --arch gemma2
# Variants: sb-drop (sb_variants.py: stick-breaking with the remainder dropped); built in: stickbreaking, sieve, ...
set -u
attn=$1; shift
out=${OUT:-results/copy_probes}
here=$(cd "$(dirname "$0")" && pwd)
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" lengthbench --plugin sb_variants run --task copy --attn "$attn" \
  --pe none --preset smoke --train-length 16 --train-samples 500000 --batch-size 64 --lr 1e-3 --d-model 128 \
  --layers 2 --heads 8 --max-multiplier 8 --eval-samples 100 --selection 8x --device cpu --results "$out" "$@"
