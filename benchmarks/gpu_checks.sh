#!/usr/bin/env bash
# The GPU checks a kernel or runner change owes, in parts that each fit a ten-minute command:
#
#   bash benchmarks/gpu_checks.sh tests OUT       # the GPU tests (kernels and modules), log with device/date
#   bash benchmarks/gpu_checks.sh kernels OUT     # kernel benchmark against SDPA (all ops, TDA included)
#   bash benchmarks/gpu_checks.sh eval OUT        # paper MQMTAR evaluation at 65,536 tokens per mechanism
#   bash benchmarks/gpu_checks.sh breakdown OUT   # each threshold kernel's share of the forward (torch.profiler)
#   bash benchmarks/gpu_checks.sh throughput OUT  # training throughput of the paper MQMTAR model
#
# OUT (default results/gpu_checks) receives the logs and tables; copy them under results/ to commit.
# Run from the repository root with lengthbench installed (pip install -e . or pip install .).
set -u -o pipefail
if [ $# -lt 1 ]; then echo "usage: gpu_checks.sh tests|kernels|eval|breakdown|throughput [OUT]" >&2; exit 2; fi
part=$1
out=${2:-results/gpu_checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
repo=$(pwd)
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "git: ${LENGTHBENCH_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "command: $*"
}
case "$part" in
  tests)
    # from /tmp, so that the installed (namespaced) package is tested, not the checkout's folders
    cmd="python3 -m pytest $repo/tests/test_kernels.py $repo/tests/test_attention_cuda.py -c $repo/pyproject.toml -m gpu -q -s -p no:cacheprovider --durations=15"
    { header "$cmd"; (cd /tmp && LENGTHBENCH_UNVERIFIED_KERNELS=1 $cmd); } 2>&1 | tee "$out/test_log.txt" ;;
  kernels)
    python3 benchmarks/kernels.py --out "$out" 2>&1 | tee "$out/benchmark_log.txt" ;;
  eval)
    python3 benchmarks/eval_time.py --attns softmax,ssmax,entmax,asentmax,stickbreaking,softpick,rectified,tra \
      --samples 1000,50,20,20,20,20,20,20 --out "$out" 2>&1 | tee "$out/eval_time_log.txt"
    python3 benchmarks/eval_time.py --pe none --attns softmax,sieve,stickbreaking --samples 50,10,20 \
      --out "$out/none" 2>&1 | tee "$out/eval_time_none_log.txt" ;;
  breakdown)
    python3 benchmarks/kernel_breakdown.py --attns entmax,sieve,sparsemax --scales 1.0,0.2 --out "$out/random" 2>&1 | tee "$out/breakdown_log.txt"
    python3 benchmarks/kernel_breakdown.py --attns entmax --model mqmtar --pe rope --out "$out/model" 2>&1 | tee -a "$out/breakdown_log.txt" ;;
  throughput)
    python3 benchmarks/train_throughput.py --task mqmtar --preset paper --pes rope --batch-sizes 1024,2048 \
      --compile-modes reduce-overhead --pad-multiples 8 --steps 150 --out "$out" 2>&1 | tee "$out/throughput_log.txt" ;;
  *)
    echo "error: unknown part '$part'; choose from: tests, kernels, eval, breakdown, throughput" >&2; exit 2 ;;
esac
