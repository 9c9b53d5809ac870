#!/usr/bin/env bash
# Session 37 (2026-11-26): issue 5's closing checks on the committed kernels, one part a call, on one H100:
#
#   LIMIT=570 bash results/gpu/device_output/2026-11-26-s37-h100/issue5.sh measure
#       alone on the GPU: benchmarks/kernels.py at L 65,536, H 16, D 32, bf16 for the ops whose benchmark rows
#       predate session 14's instruction cuts (softpick, rectified, rela, tra; tda since session 10), then
#       benchmarks/eval_time.py, the fresh `paper` MQMTAR model scoring samples at 65,536 tokens, every mechanism
#   LIMIT=570 bash results/gpu/device_output/2026-11-26-s37-h100/issue5.sh tests FILE [FILE ...] [-k EXPR]
#       pytest -m gpu on the FILEs (tests/...), 8 workers, from /tmp so that the installed package is tested;
#       MARK= drops -m gpu (test_entmax_lists.py and test_sieve_lists_backward.py skip by a condition of their
#       own, not the mark), WORKERS=N sets the workers
#
# Each part writes $OUT/PART/ (every log opens with the device, date, commit, versions and command) and packs it
# as $OUT/PART.tar.gz (TAG=NAME renames it). Carry .whl (the entmax wheel).
set -u -o pipefail
part=$1; shift
deadline=$(( $(date +%s) + ${LIMIT:-570} ))
left() { echo $(( deadline - $(date +%s) )); }
source scripts/device_env.sh || exit 1
tag=${TAG:-$part}
D=$OUT/$tag; mkdir -p "$D"
case $part in
  measure)
    kb=${KB:-softpick,rectified,rela,tra,tda}
    cmd="python3 benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms $kb --out $D/kbench"
    { header "$cmd"; timeout $(( $(left) / 3 )) $cmd; echo "exit: $?"; } > "$D/kbench_log.txt" 2>&1
    # RoPE for every mechanism; the position-free ones (stick-breaking, Sieve) with NoPE, as they are run
    rope=softmax,ssmax,assmax,gated,diffsoftmax,adatemp,softpick,scalable-softpick,rectified,rela,tra,tda,entmax,sparsemax,sentmax,asentmax
    none=softmax:none,stickbreaking:none,sieve-alg1:none,sieve:none
    counts="100$(printf ',10%.0s' $(seq 2 20))"
    cmd="python3 benchmarks/eval_time.py --attns $rope,$none --samples $counts --out $D/eval"
    { header "$cmd"; timeout $(( $(left) - 10 )) $cmd; echo "exit: $?"; } > "$D/eval_log.txt" 2>&1
    ;;
  tests)
    R=$PWD
    mkdir -p /tmp/tpath && ln -sfn "$R/tests" /tmp/tpath/tests  # tests.cli_helpers, not the checkout's package
    args=(); for a in "$@"; do case $a in tests/*) args+=("$R/$a");; *) args+=("$a");; esac; done
    run=(python3 -m pytest "${args[@]}" -c "$R/pyproject.toml" ${MARK--m gpu} -q -rfEP -p no:cacheprovider
         -n "${WORKERS:-8}" --durations=10)
    { header "${run[*]}"; (cd /tmp && PYTHONPATH=/tmp/tpath${PYTHONPATH:+:$PYTHONPATH} LENGTHBENCH_UNVERIFIED_KERNELS=1 \
        timeout $(( $(left) - 10 )) "${run[@]}"); echo "exit: $?"; } > "$D/test_log.txt" 2>&1
    ;;
  *) echo "error: unknown part '$part'; choose measure or tests" >&2; exit 2 ;;
esac
for f in "$D"/*.txt; do echo "== $f"; grep -E "^(ERR|FAILED|ERROR)|passed|failed|exit:|x\)|s per 1,000" "$f" | grep -v "^ERR" | tail -40 | cut -c1-200; done
tar czf "$OUT/$tag.tar.gz" -C "$OUT" "$tag" && rm -rf "$D"
ls -la "$OUT"
