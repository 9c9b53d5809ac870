#!/usr/bin/env bash
# Session 12, nvidia-h100-x1, carry [".whl"]. MQRAR (seed 004, priority 1), as sweeps of the product:
#   A: sweeps/mqrar_inline_c12.toml, the named variant "layout=inline at n 64" for the four mechanisms, seed 0
#   B: the same variant, Sieve + NoPE, seed 1 (session 11's Sieve stage 1 peaked at 69% and fell)
#   C: sweeps/mqrar_c11.toml (protocol c11), entmax + RoPE, seeds 1 and 2
#   D: sweeps/mqrar_c11.toml, softmax + RoPE, seed 2
# Calls 4-5 (a fresh machine, then the same one warm): Sieve's first stage on the inline variant.
#   X: sweeps/mqrar_inline_sieve_c12.toml: stage 1 with 5.12M samples at lr 3e-4, then the inline cell at n 64
#   Y: a probe, Sieve started from stick-breaking's weights: stick-breaking's stage 1 (inline, n 16; as c11's),
#      then Sieve on the inline variant at n 64 (1.28M samples, lr 1e-3, 8x selection) from it (`--init-from`)
# Every sweep resumes what it has in the store (/tmp/gres) and each run from its checkpoint, so the next call on
# the same warm machine continues where this one stopped:
#   bash results/gpu/device_output/2026-11-23-s12-h100/commands_call4.sh call4 565
set -u
call=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
left() { echo $(( deadline - $(date +%s) )); }
lane() {  # lane NAME sweep-args...
  local name=$1; shift
  header "lengthbench sweep $* --results $R --quiet" >> $OUT/$call/$name.txt
  timeout -s INT $(left) lengthbench sweep "$@" --results $R --quiet >> $OUT/$call/$name.txt 2>&1
  echo "exit: $?" >> $OUT/$call/$name.txt
}
lane X --config sweeps/mqrar_inline_sieve_c12.toml &
stage() {  # stage NAME run-args...: one run, resumed from its checkpoint, stopped at the deadline
  local name=$1; shift
  header "lengthbench run $* --results $R --quiet --resume" >> $OUT/$call/$name.txt
  timeout -s INT $(left) lengthbench run "$@" --results $R --quiet --resume >> $OUT/$call/$name.txt 2>&1
  local rc=$?; echo "exit: $rc" >> $OUT/$call/$name.txt; return $rc
}
runid() { lengthbench run "$@" --results $R --dry-run | head -1 | awk '{print $1}'; }
( P="--task mqrar --pe none --preset paper --init torch --eval-samples 200 --param layout=inline"
  S1="--attn stickbreaking $P --train-length 16 --train-samples 1280000 --max-multiplier 2"
  stage Y1 $S1 || exit 1
  stage Y2 --attn sieve $P --train-samples 1280000 --selection 8x --init-from $(runid $S1) ) &
sleep 150; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -15; done > $OUT/summary-$call.txt 2>&1
# interrupted runs: their checkpoints come back (each file under the size limit), so a fresh machine can resume them
mkdir -p $OUT/ckpt
for d in $R/checkpoints/*/; do id=$(basename $d); [ -f $R/runs/$id.parquet ] && continue; [ -f $d/train.pt ] || continue
  src=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('init_from', ''))" $d/config.json)
  cp $d/train.pt $OUT/ckpt/$id.train.pt; cp $d/config.json $OUT/ckpt/$id.config.json
  [ -n "$src" ] && cp $R/checkpoints/$src/model.pt $OUT/ckpt/$src.model.pt; done
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
