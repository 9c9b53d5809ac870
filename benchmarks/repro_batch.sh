#!/usr/bin/env bash
# One batch of seed-table cells on a GPU under a named, reduced protocol (recorded in every row's
# config_json). Usage: bash benchmarks/repro_batch.sh RESULTS_DIR SECONDS_PER_CELL TASK ATTN:PE [ATTN:PE ...]
# Protocol "r1": the quick preset (the seeds' model for the task) with 1M training samples, batch 256,
# lr 1e-3, 5% warm-up, in-distribution selection, 100 evaluation samples per length, up to 1024x.
set -u
results=$1; budget=$2; task=$3; shift 3
for cell in "$@"; do
  attn=${cell%%:*}; pe=${cell##*:}
  echo "== $task $attn $pe"
  timeout "$budget" lengthbench run --task "$task" --attn "$attn" --pe "$pe" --preset quick \
    --train-samples 1000000 --eval-samples 100 --max-multiplier 1024 --device cuda --results "$results" --quiet \
    || echo "!! $task $attn $pe did not finish within ${budget}s (or failed)"
done
