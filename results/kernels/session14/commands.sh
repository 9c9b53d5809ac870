#!/usr/bin/env bash
# Session 14 (nvidia-h100-x1, carry [".whl"]). `bash results/kernels/session14/commands.sh PART SECONDS`:
#   PART=1: where the threshold mechanisms' forward time goes (benchmarks/kernel_breakdown.py: random inputs at
#           three scales, and one evaluation sample of the paper MQMTAR model), then the GPU tests of the
#           stick-breaking and Sieve backwards (session 13's grad_buffers change, not yet run on the GPU);
#   PART=2: the GPU tests of the lean Newton passes, the one-instruction packing and the unmasked key loads
#           (test_entmax_lists.py, test_sieve_lists_backward.py, test_kernels.py (every kernel: the row-wise
#           forward tiles changed too), test_attention_cuda.py);
#   PART=4: part 2's tests that its time limits cut (all but test_kernels.py), with longer limits;
#   PART=3: alone on the GPU: the kernel benchmark (entmax, sieve, sparsemax and the row-wise kernels at
#           L 65,536, D 32), the breakdown again, and the evaluation times (benchmarks/eval_time.py).
set -u
part=$1; limit=$2; deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
export PYTHONUNBUFFERED=1
R0=$PWD; O=$OUT/k$part; mkdir -p $O
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
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
bd() {  # bd LOG args...
  local log=$1; shift
  { header "benchmarks/kernel_breakdown.py $*"; timeout $(( $(left) - 60 )) python3 benchmarks/kernel_breakdown.py "$@"; echo "exit: $?"; } >> $O/$log 2>&1
}
T="$R0/tests"
case $part in
  1)
    bd breakdown_log.txt --attns entmax,sieve --scales 1.0,0.5,0.2 --out $O/random
    bd breakdown_log.txt --attns sieve --scales 1.0 --backward --out $O/random_bwd
    bd breakdown_log.txt --attns entmax --model mqmtar --pe rope --out $O/model_entmax
    bd breakdown_log.txt --attns sieve --model mqmtar --pe none --out $O/model_sieve
    tests test_log_backward.txt $(( $(left) - 10 )) 8 $T/test_sieve_lists_backward.py "$T/test_kernels.py" -m gpu -k "sieve or stickbreaking"
    ;;
  2)
    tests test_log_lists.txt $(( $(left) - 420 )) 8 $T/test_entmax_lists.py
    tests test_log_lists_backward.txt $(( $(left) - 330 )) 8 $T/test_sieve_lists_backward.py
    tests test_log_kernels.txt $(( $(left) - 100 )) 8 $T/test_kernels.py -m gpu -k "not variants"
    tests test_log_attention_cuda.txt $(( $(left) - 10 )) 8 $T/test_attention_cuda.py
    ;;
  4)
    tests test_log_lists.txt $(( $(left) - 260 )) 8 $T/test_entmax_lists.py
    tests test_log_lists_backward.txt $(( $(left) - 150 )) 8 $T/test_sieve_lists_backward.py
    tests test_log_attention_cuda.txt $(( $(left) - 5 )) 8 $T/test_attention_cuda.py
    ;;
  3)
    M=entmax,sieve,sparsemax,softpick,rectified
    { header "benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms $M --out $O/bench"
      timeout $(( $(left) - 300 )) python3 benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms $M --out $O/bench; } > $O/bench_log.txt 2>&1
    bd breakdown_log.txt --attns entmax,sieve --scales 1.0,0.2 --out $O/random
    bd breakdown_log.txt --attns entmax --model mqmtar --pe rope --out $O/model_entmax
    { header "benchmarks/eval_time.py --pe rope --attns softmax,entmax,sparsemax,asentmax,sentmax --samples 50,10,10,10,10 --out $O/eval_rope"
      timeout $(( $(left) - 70 )) python3 benchmarks/eval_time.py --pe rope --attns softmax,entmax,sparsemax,asentmax,sentmax --samples 50,10,10,10,10 --out $O/eval_rope
      header "benchmarks/eval_time.py --pe none --attns softmax,sieve --samples 50,10 --out $O/eval_none"
      timeout $(( $(left) - 5 )) python3 benchmarks/eval_time.py --pe none --attns softmax,sieve --samples 50,10 --out $O/eval_none; } > $O/eval_time_log.txt 2>&1
    ;;
esac
for f in $O/test_log_*.txt; do [ -f $f ] && echo "$(basename $f): $(grep -E 'passed|failed|error' $f | tail -1)"; done
[ -f $O/bench_log.txt ] && grep -E "^[a-z]+ +L=" $O/bench_log.txt
[ -f $O/breakdown_log.txt ] && grep -E "^==|^ +[0-9.]+ ms" $O/breakdown_log.txt | grep -v "at::native" | cut -c1-110
[ -f $O/eval_time_log.txt ] && grep -E "samples at|failed" $O/eval_time_log.txt
tar czf $OUT/k$part.tar.gz -C $OUT k$part && rm -rf $O
echo "part $part done, $(left) s left"
