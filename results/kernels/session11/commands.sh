#!/usr/bin/env bash
# Session 11, nvidia-h100-x1, carry [".whl"]: the new entmax threshold search (kernels/entmax.py: per-column
# top-4 subset start, then a second kernel over the rows still open) on the GPU: its kernel tests and the old
# ones of entmax / sparsemax / sieve, the modules' fast paths, the benchmark, and the evaluation time.
#   bash results/kernels/session11/commands.sh 540
set -u
limit=$1; deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build  # setuptools copies a source only when it is newer than build/'s copy: a stale build/ installs old kernels
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
(cd /tmp && python3 -c "import lengthbench.kernels.entmax as e; assert e._OLD == {'old': True}, e.__file__; print('installed', e.__file__)") || exit 1
R=$PWD; O=$OUT/session11; mkdir -p $O
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
P="python3 -m pytest -c $R/pyproject.toml -m gpu -q -s -p no:cacheprovider -rf"
K="(entmax or sparsemax or sieve) and not alg1"
{ header "$P $R/tests/test_kernels.py -k '$K'"; (cd /tmp && timeout $(( $(left) - 240 )) $P $R/tests/test_kernels.py -k "$K"); } > $O/test_log_kernels.txt 2>&1
{ header "$P $R/tests/test_attention_cuda.py -k 'entmax or sparsemax or sieve'"; (cd /tmp && timeout $(( $(left) - 150 )) $P $R/tests/test_attention_cuda.py -k "entmax or sparsemax or sieve"); } > $O/test_log_modules.txt 2>&1
{ header "benchmarks/kernels.py --mechanisms entmax,sparsemax,sieve --lengths 16384,65536 --head-dims 32,64 --out $O"; timeout $(( $(left) - 90 )) python3 benchmarks/kernels.py --mechanisms entmax,sparsemax,sieve --lengths 16384,65536 --head-dims 32,64 --out $O; } > $O/benchmark_log.txt 2>&1
{ header "benchmarks/eval_time.py --attns softmax,entmax --samples 10,10 --out $O"; timeout $(( $(left) - 10 )) python3 benchmarks/eval_time.py --attns softmax,entmax --samples 10,10 --out $O; } > $O/eval_time_log.txt 2>&1
tail -3 $O/*.txt
ls -la $O
