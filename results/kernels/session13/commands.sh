#!/usr/bin/env bash
# Session 13 (nvidia-h100-x1, carry [".whl"]): Sieve's backward by candidate lists. One warm machine, three
# calls back to back, each `bash results/kernels/session13/commands.sh PART SECONDS`:
#   PART=1: GPU tests of the list backward, the list forward and the Sieve / entmax kernel tests, beside two
#           training lanes (seed 003's MQMTAR, r6, second seeds: ssmax + NAPE and softmax + RoPE) that run the
#           committed kernels (a worktree of HEAD, installed apart);
#   PART=2: the training lanes resume (the store is /tmp/gres), the tests left over;
#   PART=3: the training lanes finish, then, alone on the GPU, the kernel benchmark (Sieve, entmax, sparsemax,
#           stick-breaking at L 65,536, D 32, bf16) and Sieve's evaluation time;
#   PART=4: (after commands_retest.sh) the same two cells with seed 2.
set -u
part=$1; limit=$2; deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
export PYTHONUNBUFFERED=1
R0=$PWD; O=$OUT/k$part; mkdir -p $O
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
if [ ! -d /tmp/site_head/lengthbench ]; then  # the committed tree, for the training lanes
  rm -rf /tmp/head && git worktree add -q -f /tmp/head HEAD >/dev/null 2>&1 || cp -r $R0 /tmp/head
  (cd /tmp/head && git checkout -q HEAD -- . 2>/dev/null; rm -rf build
   python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site_head . >/tmp/pipinst2.txt 2>&1) || { cat /tmp/pipinst2.txt; exit 1; }
fi
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
G=/tmp/gres; mkdir -p $G/runs
lane() {  # lane NAME sweep-args... : the committed package, in the background
  local name=$1; shift
  header "lengthbench sweep $* --results $G --quiet (committed tree)" >> $O/$name.txt
  (cd /tmp && PYTHONPATH=/tmp/site_head:/tmp/site timeout -s INT $(( $(left) - 20 )) python3 -m lengthbench.cli sweep "$@" --results $G --quiet) >> $O/$name.txt 2>&1
  echo "exit: $?" >> $O/$name.txt
}
P="python3 -m pytest -c $R0/pyproject.toml -q -p no:cacheprovider -rfE -p no:benchmark"
tests() {  # tests LOG TIMEOUT WORKERS files-and-args...
  local log=$1 t=$2 n=$3; shift 3
  { header "$P -n $n $*"; (cd /tmp && timeout $t $P -n $n "$@"); echo "exit: $?"; } > $O/$log 2>&1
}
T="$R0/tests"
case $part in
  1)
    lane T_ssmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:ssmax:nape --seeds 1 &
    lane T_softmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:softmax:rope --seeds 1 &
    tests test_log_lists_backward.txt $(( $(left) - 240 )) 8 $T/test_sieve_lists_backward.py
    tests test_log_lists.txt $(( $(left) - 10 )) 8 $T/test_entmax_lists.py
    wait ;;
  2)
    lane T_ssmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:ssmax:nape --seeds 1 &
    lane T_softmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:softmax:rope --seeds 1 &
    K="(entmax or sparsemax or sieve or stickbreaking) and not variants"
    tests test_log_kernels.txt $(( $(left) - 150 )) 8 $T/test_kernels.py -m gpu -k "$K"
    tests test_log_attention_cuda.txt $(( $(left) - 10 )) 8 $T/test_attention_cuda.py -k "sieve or entmax or stickbreaking"
    wait ;;
  3)
    lane T_ssmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:ssmax:nape --seeds 1 &
    lane T_softmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:softmax:rope --seeds 1 &
    # the benchmark needs the GPU alone: wait for the lanes, but leave it its time
    while [ -n "$(jobs -r)" ] && [ $(left) -gt 200 ]; do sleep 5; done
    if [ -n "$(jobs -r)" ]; then echo "training lanes still running at $(date -u +%T): benchmark shares the GPU" > $O/WARNING.txt; fi
    { header "benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms sieve,entmax,sparsemax,stickbreaking,sieve-alg1 --out $O/bench"
      timeout $(( $(left) - 90 )) python3 benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms sieve,entmax,sparsemax,stickbreaking,sieve-alg1 --out $O/bench; } > $O/bench_log.txt 2>&1
    { header "benchmarks/eval_time.py --pe none --attns sieve --samples 5 --out $O/eval"
      timeout $(( $(left) - 5 )) python3 benchmarks/eval_time.py --pe none --attns sieve --samples 5 --out $O/eval; } > $O/eval_time_log.txt 2>&1
    wait ;;
  4)  # third seeds, the GPU to themselves
    lane T_ssmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:ssmax:nape --seeds 2 &
    lane T_softmax --config $R0/sweeps/mqmtar_r6.toml --cells mqmtar:softmax:rope --seeds 2 &
    wait ;;
esac
mkdir -p $O/runs $O/logs
cp $G/runs/*.parquet $O/runs/ 2>/dev/null; cp $G/logs/*.log $O/logs/ 2>/dev/null
for f in $O/*.txt; do echo "== $f"; grep -v "^device\|^torch\|^date\|^commit" $f | tail -n 12; done > $OUT/summary-k$part.txt 2>&1
for f in $G/logs/*.log; do echo "== $f"; tail -3 $f; done >> $OUT/summary-k$part.txt 2>&1
tar czf $OUT/k$part.tar.gz -C $OUT k$part && rm -rf $O
ls -la $OUT
