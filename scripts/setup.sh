#!/usr/bin/env bash
# Set up lengthbench in ./.venv (or the active virtual environment): torch first, then the package.
#
# torch: kept if it is already installed; on a machine with an NVIDIA GPU the default (CUDA) build;
# elsewhere the pinned CPU-friendly version below, which on the project's CI machines installs from a
# local wheel in seconds. Override with TORCH_SPEC (e.g. TORCH_SPEC="torch --index-url URL").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    spec="$TORCH_SPEC"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    spec="torch"
  else
    spec="torch==2.13.0"
  fi
  echo "installing $spec"
  # shellcheck disable=SC2086
  python -m pip install -q $spec
fi
# dev: the test tools, Triton among them (tests/test_kernels_interpreter.py runs the kernels on the CPU under
# its interpreter); cuda: Triton for the GPU where torch does not bring it
extras="dev"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && extras="dev,cuda"
python -m pip install -q -e ".[$extras]"
echo "lengthbench is installed in ${VIRTUAL_ENV}: activate it with '. ${VIRTUAL_ENV}/bin/activate'"
