#!/usr/bin/env bash
# Session 12, nvidia-h100-x1, carry [".whl"]: the list forward of entmax, sparsemax and Sieve (kernels/entmax.py
# `_lists_forward`, kernels/sieve.py) on the GPU: its tests and the kernel tests it touches (8 pytest workers, so
# that the Triton compilations run side by side), then the benchmarks (alone on the GPU) and the evaluation time.
#   bash results/kernels/session12/commands_lists.sh 570
set -u
limit=$1; deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
rm -rf build  # setuptools copies a source only when it is newer than build/'s copy: a stale build/ installs old kernels
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >/tmp/pipinst.txt 2>&1 || { cat /tmp/pipinst.txt; exit 1; }
(cd /tmp && python3 -c "import lengthbench.kernels.entmax as e; assert hasattr(e, '_lists_forward'), e.__file__; print('installed', e.__file__)") || exit 1
R=$PWD; O=$OUT/session12; mkdir -p $O
header() {
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (+ working tree: $(git status --short | wc -l) changed)"
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "command: $*"
}
P="python3 -m pytest -c $R/pyproject.toml -q -p no:cacheprovider -n 8 -rfE"
K="(entmax or sparsemax or sieve or stickbreaking) and not alg1"
{ header "$P -rA $R/tests/test_entmax_lists.py"; (cd /tmp && timeout $(( $(left) - 400 )) $P -rA $R/tests/test_entmax_lists.py); } > $O/test_log_lists.txt 2>&1
{ header "$P -m gpu $R/tests/test_kernels.py -k '$K'"; (cd /tmp && timeout $(( $(left) - 290 )) $P -m gpu $R/tests/test_kernels.py -k "$K"); } > $O/test_log_kernels_lists.txt 2>&1
{ header "$P -m gpu $R/tests/test_attention_cuda.py -k 'entmax or sparsemax or sieve'"; (cd /tmp && timeout $(( $(left) - 250 )) $P -m gpu $R/tests/test_attention_cuda.py -k "entmax or sparsemax or sieve"); } > $O/test_log_modules_lists.txt 2>&1
{ header "benchmarks/kernels.py --mechanisms entmax,sparsemax,sieve --lengths 65536 --head-dims 32,64 --out $O/bench"; timeout $(( $(left) - 150 )) python3 benchmarks/kernels.py --mechanisms entmax,sparsemax,sieve --lengths 65536 --head-dims 32,64 --out $O/bench; } > $O/benchmark_log.txt 2>&1
{ header "benchmarks/entmax_variants.py --lengths 65536 --head-dims 32 --variants nolists,default,lists-r1,lists-r2,lists-r8,lists-c32 --sieve --out $O/variants"; timeout $(( $(left) - 60 )) python3 benchmarks/entmax_variants.py --lengths 65536 --head-dims 32 --variants nolists,default,lists-r1,lists-r2,lists-r8,lists-c32 --sieve --out $O/variants; } > $O/variants_log.txt 2>&1
{ header "benchmarks/eval_time.py --attns softmax,entmax --samples 10,10 --out $O/eval"; timeout $(( $(left) - 5 )) python3 benchmarks/eval_time.py --attns softmax,entmax --samples 10,10 --out $O/eval; } > $O/eval_time_log.txt 2>&1
for f in $O/*.txt; do echo "== $f"; tail -n 4 $f; done
ls -laR $O | head -40
