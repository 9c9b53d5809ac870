#!/usr/bin/env bash
# Session 12, second call (nvidia-h100-x1, carry [".whl"]): the list forward's own tests to the end (the first
# call's limit cut them after 104 passes, none failed), 16 pytest workers; the list size 128 against 64; Sieve's
# evaluation time (NoPE) with the list forward. Everything comes back as one archive.
#   bash results/kernels/session12/commands_lists2.sh 420
set -u
limit=$1; deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
(cd /tmp && python3 -c "import lengthbench.kernels.entmax as e; assert hasattr(e, '_lists_forward'), e.__file__") || exit 1
R=$PWD; O=$OUT/lists2; mkdir -p $O
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
P="python3 -m pytest -c $R/pyproject.toml -q -p no:cacheprovider -n 16 -rfE -p no:benchmark"
{ header "$P $R/tests/test_entmax_lists.py"; (cd /tmp && timeout $(( $(left) - 150 )) $P $R/tests/test_entmax_lists.py); } > $O/test_log_lists.txt 2>&1
{ header "benchmarks/entmax_variants.py --lengths 65536 --head-dims 32 --variants nolists,default,lists-c128 --sieve --out $O/variants"; timeout $(( $(left) - 60 )) python3 benchmarks/entmax_variants.py --lengths 65536 --head-dims 32 --variants nolists,default,lists-c128 --sieve --out $O/variants; } > $O/variants_log.txt 2>&1
{ header "benchmarks/eval_time.py --pe none --attns sieve --samples 5 --out $O/eval"; timeout $(( $(left) - 5 )) python3 benchmarks/eval_time.py --pe none --attns sieve --samples 5 --out $O/eval; } > $O/eval_time_log.txt 2>&1
for f in $O/*.txt; do echo "== $f"; tail -n 4 $f; done
tar czf $OUT/lists2.tar.gz -C $OUT lists2 && rm -rf $O
