#!/usr/bin/env bash
# Session 17, nvidia-h100-x1, carry [".whl", ".carry"]. Every call is self-contained: sessions 15 and 16 lost their
# machine between calls, and a cell's training state (weights + AdamW moments, about 100 MB) cannot travel (64 MiB).
# Its trained weights can: model.pt (about 34 MB) comes back in 15 MiB parts and the next call scores from it
# (lengthbench.runner.Trainer.load_trained), beside the next cell's training.
#   bash results/gpu/device_output/2026-11-23-s17-h100/commands.sh cell SECONDS CELLS SEEDS [SWEEP]
#       CELLS (comma-separated) of SWEEP (default sweeps/mqmtar_r6.toml) in one sweep; first the trained models in
#       .carry/ are put back in its store. Back: cell.tar.gz (logs, finished rows, eval_rows.json), and
#       ckpt-RUN.tar.part-?? for every trained model whose scoring did not finish.
#   then, while more than 150 s are left: benchmarks/train_throughput.py, compiled references against the fused
#   ops eagerly, for entmax + RoPE and Sieve + NoPE (paper MQMTAR model, batch 128).
set -u
what=$1; limit=$2
deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
source scripts/device_env.sh || exit 1
D=$OUT/$what; mkdir -p $D
header "$0 $*" > $D/header.txt
G=/tmp/gres
mkdir -p $G/checkpoints
for first in .carry/*.tar.part-aa; do
  [ -f "$first" ] || continue
  cat "${first%aa}"?? | tar xf - -C $G/checkpoints && echo "put back: $first" >> $D/header.txt
done
cells=$3; seeds=$4; sweep=${5:-sweeps/mqmtar_r6.toml}
timeout -s INT $(( $(left) - 25 )) lengthbench sweep --config $sweep --cells $cells --seeds $seeds \
  --results $G --quiet > $D/sweep.txt 2>&1
echo "exit: $?" >> $D/sweep.txt
mkdir -p $D/runs $D/logs
cp $G/runs/*.parquet $D/runs/ 2>/dev/null; cp $G/logs/*.log $D/logs/ 2>/dev/null
for dir in $G/checkpoints/*/; do
  run=$(basename $dir)
  [ -f $dir/model.pt ] || continue
  cp $dir/eval_rows.json $D/logs/$run.eval_rows.json 2>/dev/null
  [ -f $G/runs/$run.parquet ] && continue
  tar cf - -C $G/checkpoints $(cd $G/checkpoints && ls -d $run/model.pt $run/config.json $run/eval_rows.json 2>/dev/null) \
    | split -b 15m - $OUT/ckpt-$run.tar.part-
done
for spec in entmax:rope sieve:none; do
  [ $(left) -gt 150 ] || break
  timeout $(( $(left) - 20 )) python3 benchmarks/train_throughput.py --attns ${spec%%:*} --pes ${spec##*:} \
    --batch-sizes 128 --compile-modes reduce-overhead,eager --steps 200 --warmup 60 --out $D/tp_${spec%%:*} \
    >> $D/speed.txt 2>&1
  echo "exit $spec: $?" >> $D/speed.txt
done
tar czf $OUT/$what.tar.gz -C $OUT $what
ls -la $OUT
for f in $D/*.txt $D/logs/*.log; do [ -f $f ] && { echo "== $f"; tail -12 $f | cut -c1-220; }; done
