#!/usr/bin/env bash
# Session 12, nvidia-h100-x1, carry [".whl"]. MQRAR (seed 004, priority 1), as sweeps of the product:
#   A: sweeps/mqrar_inline_c12.toml, the named variant "layout=inline at n 64" for the four mechanisms, seed 0
#   B: the same variant, Sieve + NoPE, seed 1 (session 11's Sieve stage 1 peaked at 69% and fell)
#   C: sweeps/mqrar_c11.toml (protocol c11), entmax + RoPE, seeds 1 and 2
#   D: sweeps/mqrar_c11.toml, softmax + RoPE, seed 2
# Call 2 (same warm machine): C resumes (entmax + RoPE seeds 1 and 2, stage 3's evaluation); E:
# sweeps/mqrar_inline_c12_lr3e-4.toml, Sieve seeds 0 and 1 at lr 3e-4 (at 1e-3 its stage 1 diverged in call 1);
# F: the inline variant, stick-breaking seeds 1 and 2; G: the entmax kernel tests (the session-11 variant tests
# first), beside the training.
# (Call 1's machine went back before this call, so C starts again from stage 1.)
# Every sweep resumes what it has in the store (/tmp/gres) and each run from its checkpoint, so the next call on
# the same warm machine continues where this one stopped:
#   bash results/gpu/device_output/2026-11-23-s12-h100/commands_call2.sh call2 560
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
lane C --config sweeps/mqrar_c11.toml --cells mqrar:entmax:rope --seeds 1,2 --per-gpu 2 &
lane E --config sweeps/mqrar_inline_c12_lr3e-4.toml --cells mqrar:sieve:none --seeds 0,1 --per-gpu 2 &
lane F --config sweeps/mqrar_inline_c12.toml --cells mqrar:stickbreaking:none --seeds 1,2 --per-gpu 2 &
R0=$PWD; P="python3 -m pytest -c $R0/pyproject.toml -m gpu -q -s -p no:cacheprovider -rf"
K="(entmax or sparsemax or sieve) and not alg1"
( export PYTHONUNBUFFERED=1
  { header "$P $R0/tests/test_kernels.py -k 'entmax_variants or threshold_variants'"; (cd /tmp && timeout $(( $(left) - 200 )) $P $R0/tests/test_kernels.py -k "entmax_variants or threshold_variants"); } > $OUT/$call/G_test_variants.txt 2>&1
  { header "$P $R0/tests/test_kernels.py -k '$K and not variants'"; (cd /tmp && timeout $(( $(left) - 30 )) $P $R0/tests/test_kernels.py -k "$K and not variants"); } > $OUT/$call/G_test_kernels.txt 2>&1 ) &
sleep 150; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -15; done > $OUT/summary-$call.txt 2>&1
# interrupted runs: their checkpoints come back (one tar each), so a fresh machine can resume them
mkdir -p $OUT/ckpt
for d in $R/checkpoints/*/; do id=$(basename $d); [ -f $R/runs/$id.parquet ] && continue; [ -f $d/train.pt ] || continue
  src=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('init_from', ''))" $d/config.json)
  tar cf $OUT/ckpt/$id.tar -C $R/checkpoints $id ${src:+$src/model.pt}; done
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
