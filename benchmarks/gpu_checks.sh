#!/usr/bin/env bash
# The GPU checks a kernel or runner change owes, in parts that each fit a ten-minute command:
#
#   bash benchmarks/gpu_checks.sh tests OUT       # the kernel tests against the float64 references, log with device/date
#   bash benchmarks/gpu_checks.sh tests-lists OUT # the list forward/backward of entmax, sparsemax and Sieve
#   bash benchmarks/gpu_checks.sh tests-modules OUT  # each module's fast path against its reference; compiled references;
#                                                    # the short-rows kernels; the query, key and value heads op; the training step's gradients
#   bash benchmarks/gpu_checks.sh kernels OUT     # kernel benchmark against SDPA (every fused op)
#   bash benchmarks/gpu_checks.sh long-walks OUT  # stick-breaking and sieve-window at 65,536 on random and long-walk inputs
#   bash benchmarks/gpu_checks.sh eval OUT        # paper MQMTAR evaluation at 65,536 tokens per mechanism
#   bash benchmarks/gpu_checks.sh eval-trained OUT  # trains small MQRAR and MQMTAR models (about 10 minutes), then
#                                                    # times their scoring at 65,536 tokens and their kernels' inputs
#   bash benchmarks/gpu_checks.sh throughput OUT  # training throughput of the paper models (default step, batch 128;
#                                                  # BATCH=512 for the other; TASKS, PES, WARM_JOBS; ATTNS: some
#                                                  # mechanisms only, softmax + RoPE always first), one command
#
# OUT (default ./gpu_checks) receives the logs and tables. The committed tables are results/benchmarks/*
# (results/benchmarks/README.md says how each is brought up to date).
# Run from the repository root with lengthbench installed (pip install -e . or pip install .).
set -u -o pipefail
if [ $# -lt 1 ]; then
  echo "usage: gpu_checks.sh tests|tests-lists|tests-modules|kernels|long-walks|eval|eval-trained|throughput [OUT]" >&2
  exit 2
fi
part=$1
out=${2:-gpu_checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
repo=$(pwd)
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "git: $(python3 -c "from lengthbench.devices import git_sha; print(git_sha())" 2>/dev/null || echo unknown)"
  echo "command: $*"
}
case "$part" in
  tests|tests-lists|tests-modules)
    # On one H100 80GB with 8 workers (2026-12-06) the three parts took 7.5, 3.9 and 9.4 minutes, and 6 cases of
    # `tests` ran out of GPU memory (TDA's float64 references at 4,096 tokens, up to 15 GB a worker): `tests`
    # takes 6 workers unless WORKERS says otherwise. The list files skip by a condition of their own (a GPU, or
    # the Triton interpreter on a CPU), not by the gpu mark, so they run unmarked.
    case "$part" in
      tests) files="tests/test_kernels.py"; mark="-m gpu"; default_workers=6 ;;
      tests-lists) files="tests/test_entmax_lists.py tests/test_sieve_lists_backward.py"; mark=""; default_workers=8 ;;
      tests-modules) files="tests/test_attention_cuda.py tests/test_compiled_reference.py tests/test_short_rows_kernels.py tests/test_views.py tests/test_train_step_gpu.py"; mark="-m gpu"; default_workers=8 ;;
    esac
    paths=$(for f in $files; do printf '%s ' "$repo/$f"; done)
    # pytest-xdist where it is installed
    workers=""; python3 -c "import xdist" 2>/dev/null && workers="-n ${WORKERS:-$default_workers}"
    # from /tmp, so that the installed (namespaced) package is tested, not the checkout's folders; -rP keeps each
    # case's printed errors (ERR lines)
    cmd="python3 -m pytest $paths-c $repo/pyproject.toml $mark $workers -q -rfEP -p no:cacheprovider --durations=15"
    { header "$cmd"; (cd /tmp && $cmd); } 2>&1 \
      | tee "$out/test_log_$part.txt" ;;
  kernels)
    python3 benchmarks/kernels.py --out "$out" 2>&1 | tee "$out/benchmark_log.txt" ;;
  long-walks)
    python3 benchmarks/kernels.py --mechanisms stickbreaking,sieve-window --lengths 65536 --head-dims 32,64 \
      --inputs random,walk4,walk8 --out "$out" 2>&1 | tee "$out/long_walks_log.txt" ;;
  eval)
    python3 benchmarks/eval_time.py --attns softmax,ssmax,entmax,asentmax,stickbreaking,softpick,rectified,tra \
      --samples 1000,50,20,20,20,20,20,20 --out "$out" 2>&1 | tee "$out/eval_time_log.txt"
    python3 benchmarks/eval_time.py --pe none --attns softmax,sieve,stickbreaking --samples 50,10,20 \
      --out "$out/none" 2>&1 | tee "$out/eval_time_none_log.txt" ;;
  eval-trained)
    # Trained models for the scoring times (results/benchmarks/eval_time.md) and the kernel benchmark's `trained`
    # inputs: the paper models, 1.28M samples each at the task's training length (the papers train 20M-50M), into
    # OUT/trained_runs (resumed if interrupted). Their in-distribution accuracy is recorded beside each time.
    runs="$out/trained_runs"
    for cell in mqrar:softmax:rope mqrar:stickbreaking:none mqrar:sieve-window:none mqrar:sieve:none \
                mqmtar:softmax:rope mqmtar:entmax:rope mqmtar:asentmax:rope; do
      IFS=: read -r task attn pe <<< "$cell"
      lengthbench run --task "$task" --attn "$attn" --pe "$pe" --preset paper --train-samples "${TRAIN_SAMPLES:-1280000}" \
        --warmup-steps 1000 --max-multiplier 1 --eval-samples 200 --results "$runs" 2>&1 | tail -3
    done 2>&1 | tee "$out/eval_trained_log.txt"
    python3 benchmarks/eval_time.py --task mqrar --runs "$runs" --samples 50,20,20,20 \
      --attns softmax:rope,stickbreaking:none,sieve-window:none,sieve:none --out "$out" 2>&1 | tee -a "$out/eval_trained_log.txt"
    python3 benchmarks/eval_time.py --task mqmtar --runs "$runs" --samples 50,20,20 \
      --attns softmax:rope,entmax:rope,asentmax:rope --out "$out" 2>&1 | tee -a "$out/eval_trained_log.txt"
    for attn in stickbreaking sieve-window; do
      checkpoint=$(ls "$runs"/checkpoints/mqrar-"$attn"-none-*/model.pt | head -1)
      python3 benchmarks/kernels.py --mechanisms "$attn" --lengths 65536 --inputs trained --trained "$checkpoint" \
        --out "$out/kernels_trained_$attn" 2>&1 | tee -a "$out/eval_trained_log.txt"
    done ;;
  throughput)
    # the committed table: results/benchmarks/train_throughput.md. One command for every task (TASKS, comma-separated):
    # per task softmax + RoPE first and again last (the command's steadiness); every cell compiled first, WARM_JOBS at a
    # time (--warm-jobs); 300 timed steps after 20, at batch 512 200 after 100 (its first cells ran slow for their
    # first seconds after 20). PES chooses the encodings (e.g. rope,nape). Alone on the machine: commands on several
    # GPUs of one host at once starve each other's data workers.
    # ATTNS (comma-separated) measures those mechanisms only, after softmax + RoPE (the ratios' baseline), e.g. the cells
    # that a change of one mechanism's kernels leaves to be measured again; softmax + RoPE runs first and last even
    # where PES leaves RoPE out (e.g. PES=nape: the NAPE cells only, beside their baseline)
    if [ "${BATCH:-128}" = 512 ]; then timed="--steps 200 --warmup 100"; else timed="--steps 300 --warmup 20"; fi
    attns=softmax,ssmax,entmax,asentmax,stickbreaking,sieve,sieve-window,softpick,tra,tda
    if [ -n "${ATTNS:-}" ]; then
      others=$(tr , '\n' <<< "$ATTNS" | grep -vx -e softmax -e '' | paste -sd, -)
      attns="softmax${others:+,$others}"  # ATTNS=softmax: the baseline alone
    fi
    python3 benchmarks/train_throughput.py --tasks "${TASKS:-mqmtar,mqrar,copy}" --preset paper --pes "${PES:-rope}" \
      --batch-sizes "${BATCH:-128}" --attns "$attns" --baseline \
      $timed --warm-jobs "${WARM_JOBS:-12}" --out "$out/throughput_b${BATCH:-128}" 2>&1 \
      | grep -v -i warn | tee -a "$out/throughput_log.txt" ;;
  *)
    echo "error: unknown part '$part'; choose from: tests, tests-lists, tests-modules, kernels, long-walks, eval," \
      "eval-trained, throughput" >&2; exit 2 ;;
esac
