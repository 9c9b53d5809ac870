#!/usr/bin/env bash
# Session 17, call 2 (nvidia-h100-x1, carry [".whl"]): call 1's r6 cell (mqmtar:asentmax:nape, seed 1) logged no
# validation in 520 s, so not even 1,000 steps on the compiled references. Where does the time go?
#   1. the real path, short: a sweep worker with 300 steps (validation every 100), logging its first steps' times
#   2. train_throughput.py --trace: each warm-up step's width and seconds, bucket widths as the runner (pad 8)
#   3. the same with one width (every batch padded to the widest)
# Each step stops with every thread's stack (faulthandler) where it runs past its time.
set -u
limit=$1
deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
source scripts/device_env.sh || exit 1
D=$OUT/probe; mkdir -p $D
header "$0 $*" > $D/header.txt
cat > /tmp/probe.toml <<'TOML'
cells = ["mqmtar:asentmax:nape"]
seeds = [1]
preset = "paper"
device = "auto"
per_gpu = 1
[overrides]
train_samples = 38400
lr = 0.0003
eval_every = 100
eval_samples = 50
max_multiplier = 2
TOML
PYTHONFAULTHANDLER=1 timeout -s INT 150 lengthbench sweep --config /tmp/probe.toml --results /tmp/probe --quiet \
  > $D/sweep.txt 2>&1
echo "exit: $?" >> $D/sweep.txt
cp /tmp/probe/logs/*.log $D/ 2>/dev/null
t=$(( $(left) - 120 )); [ $t -gt 200 ] && t=130
timeout $(( t + 10 )) python3 benchmarks/train_throughput.py --attns asentmax --pes nape --batch-sizes 128 \
  --compile-modes reduce-overhead --steps 200 --warmup 40 --trace --stacks-after $t --out $D/tp8 > $D/tp8.txt 2>&1
echo "exit: $?" >> $D/tp8.txt
t=$(( $(left) - 15 ))
timeout $(( t + 10 )) python3 benchmarks/train_throughput.py --attns asentmax --pes nape --batch-sizes 128 \
  --compile-modes reduce-overhead --pad-multiples 0 --steps 300 --warmup 10 --trace --stacks-after $t \
  --out $D/tp0 > $D/tp0.txt 2>&1
echo "exit: $?" >> $D/tp0.txt
tar czf $OUT/probe.tar.gz -C $OUT probe
for f in $D/*.txt $D/*.log; do [ -f $f ] && { echo "== $f"; grep -v "^  File\|^    " $f | tail -25 | cut -c1-200; }; done
