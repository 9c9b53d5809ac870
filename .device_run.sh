set -x
export LENGTHBENCH_GIT_SHA=$(cat .sha)
python -m pip install -q --no-deps --no-index --find-links .whl entmax pytest pytest-xdist execnet iniconfig pluggy
python -m pip install -q . --no-deps --no-build-isolation
mkdir -p /tmp/res
nvidia-smi --query-gpu=name --format=csv
python benchmarks/step_profile.py --task mqmtar --attns softmax,tda --top 25 --out /tmp/res/p_mqmtar.txt > /tmp/res/p_mqmtar.log 2>&1
python benchmarks/step_profile.py --task copy --attns softmax,sieve-entmax,asentmax --pe rope --top 25 --out /tmp/res/p_copy.txt > /tmp/res/p_copy.log 2>&1
python benchmarks/step_profile.py --task copy --attns softmax,asentmax --pe nape --top 25 --out /tmp/res/p_copy_nape.txt > /tmp/res/p_copy_nape.log 2>&1
touch /tmp/res/prof.done
