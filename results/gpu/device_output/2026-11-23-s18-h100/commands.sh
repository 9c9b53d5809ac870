#!/usr/bin/env bash
# Prepared in session 17, run in session 18 (carry [".whl"] only: nothing was in .carry), four calls:
#   1. warm 300 mqmtar:asentmax:nape,mqmtar:entmax:rope        -> call1-warm.tar.gz (caches too large to come back)
#   2. cell 560 mqmtar:asentmax:nape 1   (a fresh machine)      -> call2-cell.tar.gz (stopped at step ~30,000)
#   3. cell 540 mqmtar:asentmax:nape 1   (the same machine)     -> call3-cell.tar.gz (resumed, finished, scored)
#   4. cell 560 mqmtar:asentmax:nape 2   (the same machine)     -> call4-cell.tar.gz (trained and scored)
# nvidia-h100-x1, carry [".whl", ".carry"]. Every call is self-contained (machines are lost between calls).
# A cell's training state cannot travel (about 100 MB), its trained weights can: model.pt (about 34 MB) comes back in
# 15 MiB parts and the next call scores from it (Trainer.load_trained). The dense references' compilation (148 s on
# the H100, session 17) comes back as a compile cache file ($LENGTHBENCH_COMPILE_CACHE) and is carried after.
#   bash results/gpu/device_output/2026-11-23-s18-h100/commands.sh warm SECONDS CELLS [SWEEP]
#       200 training steps of each of CELLS (comma-separated, side by side): their compile cache files come back
#   bash results/gpu/device_output/2026-11-23-s18-h100/commands.sh cell SECONDS CELLS SEEDS [SWEEP]
#       CELLS of SWEEP (default sweeps/mqmtar_r6.toml) in one sweep (two side by side); first the trained models and
#       compile caches in .carry/ are put in place. Back: cell.tar.gz (logs, finished rows, eval_rows.json),
#       ckpt-RUN.tar.part-?? for every trained model whose scoring did not finish, new compile cache files.
# Put what comes back under .carry/ for the next call: the ckpt parts as they are, compile/*.bin in .carry/compile/.
set -u
what=$1; limit=$2; cells=$3
deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
source scripts/device_env.sh || exit 1
D=$OUT/$what; mkdir -p $D
header "$0 $*" > $D/header.txt
G=/tmp/gres
mkdir -p $G/checkpoints /tmp/ccache
export LENGTHBENCH_COMPILE_CACHE=/tmp/ccache
cp .carry/compile/*.bin /tmp/ccache/ 2>/dev/null && ls /tmp/ccache >> $D/header.txt
for first in .carry/*.tar.part-aa; do
  [ -f "$first" ] || continue
  cat "${first%aa}"?? | tar xf - -C $G/checkpoints && echo "put back: $first" >> $D/header.txt
done
if [ "$what" = warm ]; then
  sweep=${4:-sweeps/mqmtar_r6.toml}
  # the same graphs as the sweep's cells (batch, model, compile mode), 200 steps
  python3 - "$sweep" > /tmp/warm.toml <<'PY'
import json, sys, tomllib
config = tomllib.load(open(sys.argv[1], "rb"))
overrides = dict(config.get("overrides", {}), train_samples=25600, eval_samples=10, max_multiplier=1)
print(f'preset = "{config["preset"]}"\ndevice = "auto"\nper_gpu = 2\n[overrides]')
print("\n".join(f"{k} = {json.dumps(v)}" for k, v in overrides.items()))
PY
  timeout -s INT $(( $(left) - 15 )) lengthbench sweep --config /tmp/warm.toml --cells $cells --seeds 0 \
    --results /tmp/warm --quiet > $D/sweep.txt 2>&1
  echo "exit: $?" >> $D/sweep.txt
  cp /tmp/warm/logs/*.log $D/ 2>/dev/null
else
  seeds=$4; sweep=${5:-sweeps/mqmtar_r6.toml}
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
fi
for f in /tmp/ccache/*.bin; do  # the compile caches this call wrote
  [ -f "$f" ] && [ ! -f .carry/compile/$(basename $f) ] && { mkdir -p $OUT/compile; cp $f $OUT/compile/; }
done
for f in $D/*.txt $D/*.log $D/logs/*.log; do [ -f $f ] && { echo "== $f"; tail -12 $f | cut -c1-220; }; done
# at most 8 files come back: the folder travels as one archive
tar czf $OUT/$what.tar.gz -C $OUT $what && rm -rf $D
ls -laR $OUT | cut -c1-150
