#!/usr/bin/env bash
# Session 15 (nvidia-h100-x1, carry [".whl"]). `bash results/kernels/session15/commands.sh PART SECONDS`:
#   PART=1: the GPU tests of the first stage that merges two key tiles a step (kernels/entmax.py, `pairs`):
#           test_entmax_lists.py (with the new test_pair_merges_equal_single_inserts), test_sieve_lists_backward.py,
#           and test_kernels.py's entmax, sparsemax and Sieve kernels (every dtype and shape);
#   PART=v: alone on the GPU: the variants benchmark (default against `nopairs`, entmax and Sieve forwards at
#           L 65,536, D 32) and the untrained models' evaluation times (softmax, entmax, asentmax + NAPE);
#   PART=2: alone on the GPU: the variants benchmark (default against `nopairs`, entmax and Sieve forwards at
#           L 65,536, D 32), the kernel benchmark (entmax, sieve, sparsemax), the breakdown and the evaluation
#           times of the untrained paper MQMTAR model (benchmarks/eval_time.py).
set -u
part=$1; limit=$2; deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
export PYTHONUNBUFFERED=1
R0=$PWD; O=$OUT/k$part; mkdir -p $O
export PYTHONPATH=/tmp/site
if [ -z "${SKIP_INSTALL:-}" ]; then  # SKIP_INSTALL=1: a caller installed it (commands2.sh of the MQMTAR lane)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  rm -rf build
  python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
fi
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
P="python3 -m pytest -c $R0/pyproject.toml -q -p no:cacheprovider -rfE -p no:benchmark"
tests() {  # tests LOG TIMEOUT WORKERS files-and-args...
  local log=$1 t=$2 n=$3; shift 3
  { header "$P -n $n $*"; (cd /tmp && timeout $t $P -n $n "$@"); echo "exit: $?"; } > $O/$log 2>&1
}
run() {  # run LOG RESERVE command...
  local log=$1 reserve=$2; shift 2
  { header "$*"; timeout $(( $(left) - reserve )) "$@"; echo "exit: $?"; } >> $O/$log 2>&1
}
T="$R0/tests"
case $part in
  1)
    tests test_log_lists.txt $(( $(left) - 300 )) 8 $T/test_entmax_lists.py
    tests test_log_lists_backward.txt $(( $(left) - 200 )) 8 $T/test_sieve_lists_backward.py
    tests test_log_kernels.txt $(( $(left) - 10 )) 8 $T/test_kernels.py -m gpu -k "(entmax or sparsemax or sieve) and not variants"
    ;;
  v)
    run variants_log.txt 100 python3 benchmarks/entmax_variants.py --lengths 65536 --head-dims 32 --variants default,nopairs --sieve --out $O/variants
    run eval_time_log.txt 5 python3 benchmarks/eval_time.py --attns softmax,entmax,asentmax:nape --samples 50,10,10 --out $O/eval_fresh
    ;;
  2)
    run variants_log.txt 420 python3 benchmarks/entmax_variants.py --lengths 65536 --head-dims 32 --variants default,nopairs --sieve --out $O/variants
    run bench_log.txt 300 python3 benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms entmax,sieve,sparsemax --out $O/bench
    run breakdown_log.txt 220 python3 benchmarks/kernel_breakdown.py --attns entmax,sieve --scales 1.0 --out $O/random
    run eval_time_log.txt 90 python3 benchmarks/eval_time.py --attns softmax,entmax,asentmax,sentmax --samples 50,10,10,10 --out $O/eval_rope
    run eval_time_log.txt 5 python3 benchmarks/eval_time.py --pe none --attns softmax,sieve --samples 50,10 --out $O/eval_none
    ;;
esac
for f in $O/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | grep -v "^\s*$" | tail -14; done | cut -c1-220 > $OUT/summary-k$part.txt
tar czf $OUT/k$part.tar.gz -C $OUT k$part && rm -rf $O
cat $OUT/summary-k$part.txt | tail -60
