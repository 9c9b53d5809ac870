set -x
export LENGTHBENCH_GIT_SHA=$(cat .sha)
R=$PWD
python -m pip install -q --no-deps --no-index --find-links .whl entmax pytest pytest-xdist execnet iniconfig pluggy
python -m pip install -q . --no-deps --no-build-isolation
mkdir -p /tmp/res
(cd /tmp && python -m pytest $R/tests/test_kernels.py $R/tests/test_fidelity.py -n 8 -q -k tda -p no:cacheprovider > /tmp/res/tests_tda.txt 2>&1; echo "rc $?" >> /tmp/res/tests_tda.txt)
grep -E "ERR tda .*rows|passed|failed" /tmp/res/tests_tda.txt | tail -3
touch /tmp/res/tests.done
python benchmarks/train_levers.py --tasks mqmtar,mqrar --attns tda --steps 300 --levers '{"r128w4": {"LENGTHBENCH_CAPTURE_TUNING": {"tda": {"rows": [128, 32, 4]}}}, "r128w8": {"LENGTHBENCH_CAPTURE_TUNING": {"tda": {"rows": [128, 32, 8]}}}, "r128n64": {"LENGTHBENCH_CAPTURE_TUNING": {"tda": {"rows": [128, 64, 8]}}}}' --out /tmp/res/levers_a > /tmp/res/levers_a.log 2>&1
touch /tmp/res/levers_a.done
python benchmarks/train_levers.py --tasks copy --attns tda --steps 300 --levers '{"r256w8": {"LENGTHBENCH_CAPTURE_TUNING": {"tda": {"rows": [256, 32, 8]}}}, "r256w4": {"LENGTHBENCH_CAPTURE_TUNING": {"tda": {"rows": [256, 32, 4]}}}}' --out /tmp/res/levers_b > /tmp/res/levers_b.log 2>&1
touch /tmp/res/levers_b.done
