#!/usr/bin/env bash
# One CPU probe of a Sieve variant (REPRODUCTION.md, session 4): the smoke preset, NoPE, up to 4x.
# Usage, from the repository root with lengthbench installed:
#   bash benchmarks/sieve_probes/probe.sh LABEL TASK ATTN [extra lengthbench-run args]
#   e.g. bash benchmarks/sieve_probes/probe.sh eps2m 2back sieve-eps --attn-param eps=2 --attn-param masked=1
# Variants (plugins in sieve_variants.py): sieve-temp (T), sieve-eps (eps, masked), sieve-diag, sieve-st,
# sieve-bias; built in: sieve, sieve-alg1 (= sieve-eps eps=2 masked=1), stickbreaking.
set -u
label=$1; task=$2; attn=$3; shift 3
out=${OUT:-/tmp/sieve_probes}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/logs"
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" lengthbench --plugin sieve_variants run --task "$task" --attn "$attn" \
  --pe none --preset smoke --results "$out/runs/$label" --max-multiplier 4 --quiet "$@" | tee "$out/logs/$label.log"
