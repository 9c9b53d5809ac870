# Sourced by scripts that run the benchmarks and GPU tests on a GPU machine without network access: installs the
# carried wheels (.whl) and this checkout on the device machine, and defines `header`, the lines that open
# every log there (device, date, commit, torch and triton versions, the command).
#   source scripts/device_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || return 1
rm -rf build
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 \
  || { cat /tmp/pipinst.txt; return 1; }
export PYTHONUNBUFFERED=1
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
