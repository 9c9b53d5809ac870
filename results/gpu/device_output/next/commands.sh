#!/usr/bin/env bash
# Prepared in session 16, not run yet: the next session moves it to its dated folder when it runs it.
# nvidia-h100-x1, carry [".whl"]. Every call is self-contained (no state across calls: sessions 15 and 16 lost
# their machine between calls).
#   bash results/gpu/device_output/next/commands.sh speed SECONDS
#       the training speed of models with fused ops on their compiled dense references (session 16's change)
#       against the fused ops eagerly (`--compile-modes eager`), paper MQMTAR model, batch 128; then a short
#       real run (training on the references, validation and scoring on the fused ops) to 2x.
#   bash results/gpu/device_output/next/commands.sh cell SECONDS CELL SEED [SWEEP]
#       one r6 cell alone (default sweeps/mqmtar_r6.toml), its rows back in the archive.
set -u
what=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
source scripts/device_env.sh || exit 1
D=$OUT/$what; mkdir -p $D
header "$0 $*" > $D/header.txt
if [ "$what" = speed ]; then
  for spec in entmax:rope asentmax:nape sieve:none; do
    attn=${spec%%:*}; pe=${spec##*:}
    [ $(left) -gt 120 ] || break
    timeout $(( $(left) - 100 )) python3 benchmarks/train_throughput.py --attns $attn --pes $pe --batch-sizes 128 \
      --compile-modes reduce-overhead,eager --steps 300 --warmup 60 --out $D/tp_$attn >> $D/speed.txt 2>&1
    echo "exit $attn: $?" >> $D/speed.txt
  done
  # the whole loop on the GPU: 1,000 steps on the references, validation every 500 and scoring to 2x on the op
  timeout $(( $(left) - 15 )) lengthbench run --task mqmtar --attn asentmax --pe nape --preset paper \
    --train-samples 128000 --eval-every 500 --warmup-steps 100 --max-multiplier 2 --eval-samples 50 \
    --results /tmp/lbrun --quiet > $D/run.txt 2>&1
  echo "exit run: $?" >> $D/run.txt
else
  cell=$3; seed=$4; sweep=${5:-sweeps/mqmtar_r6.toml}
  timeout -s INT $(( $(left) - 15 )) lengthbench sweep --config $sweep --cells $cell --seeds $seed \
    --results /tmp/gres --quiet > $D/sweep.txt 2>&1
  echo "exit: $?" >> $D/sweep.txt
  mkdir -p $D/runs $D/logs
  cp /tmp/gres/runs/*.parquet $D/runs/ 2>/dev/null; cp /tmp/gres/logs/*.log $D/logs/ 2>/dev/null
fi
tar czf $OUT/$what.tar.gz -C $OUT $what
for f in $D/*.txt $D/logs/*.log; do [ -f $f ] && { echo "== $f"; tail -15 $f | cut -c1-220; }; done
