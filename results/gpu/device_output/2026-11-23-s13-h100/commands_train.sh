#!/usr/bin/env bash
# Session 13, nvidia-h100-x1, carry [".whl"]. MQRAR (seed 004, priority 1), as sweeps of the product:
#   A: sweeps/mqrar_inline_sieve_anneal.toml, Sieve + NoPE on the inline variant with the entmax filter widened
#      early (alpha 1.1 -> 1.25 -> 1.5 at n 16, then the cell at alpha 1.5, n 64), seeds 0, 1, 2
#   B: sweeps/mqrar_inline_c12.toml (protocol i12), entmax + RoPE, seeds 1 and 2 (cut in session 12)
# The kernels are those of the commit (a helper's uncommitted kernel work in the working tree is set aside).
# Every sweep resumes what it has in the store (/tmp/gres), each run from its checkpoint, so the next call on the
# same warm machine continues where this one stopped:
#   bash results/gpu/device_output/2026-11-23-s13-h100/commands_train.sh call1 570
set -u
call=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
git checkout -q HEAD -- kernels tests 2>/dev/null; git clean -qfd kernels tests 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
R=/tmp/gres; mkdir -p $R/runs $OUT/$call
# a fresh machine: resume runs whose checkpoints came back from an earlier machine (carried under ckpt/)
for t in ckpt/*.tar; do [ -f "$t" ] && mkdir -p $R/checkpoints && tar xf "$t" -C $R/checkpoints; done
for p in ckpt/runs/*.parquet; do [ -f "$p" ] && cp -n "$p" $R/runs/; done
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
lane A --config sweeps/mqrar_inline_sieve_anneal.toml --seeds 0,1,2 --per-gpu 3 &
lane B --config sweeps/mqrar_inline_c12.toml --cells mqrar:entmax:rope --seeds 1,2 --per-gpu 2 &
sleep 120; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv > $OUT/$call/nvidia-smi.txt
wait
mkdir -p $OUT/$call/runs $OUT/$call/logs
cp $R/runs/*.parquet $OUT/$call/runs/ 2>/dev/null; cp $R/logs/*.log $OUT/$call/logs/ 2>/dev/null
for f in $OUT/$call/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -15; done > $OUT/summary-$call.txt 2>&1
for f in $R/logs/*.log; do echo "== $f"; tail -4 $f; done >> $OUT/summary-$call.txt 2>&1
# interrupted runs: their checkpoints come back (one tar each), so a fresh machine can resume them
mkdir -p $OUT/ckpt
for d in $R/checkpoints/*/; do id=$(basename $d); [ -f $R/runs/$id.parquet ] && continue; [ -f $d/train.pt ] || continue
  src=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('init_from', ''))" $d/config.json)
  tar cf $OUT/ckpt/$id.tar -C $R/checkpoints $id ${src:+$src/model.pt}; done
tar czf $OUT/$call.tar.gz -C $OUT $call && rm -rf $OUT/$call
ls -la $OUT
