#!/usr/bin/env bash
# Session 37 (2026-11-25): session 36's next/commands.sh as prepared there, unchanged (an unfinished cell's train.pt
# comes back only under 40 MB; session 36's call 4 sent a paper MQMTAR checkpoint with it, 9 parts of 15 MB, which did
# not fit).
# Session 36's changes:
# a carried run's scored lengths and the tallies of the length it was scoring (logs/RUN.eval_rows.json,
# logs/RUN.eval_samples_partial.json) come back too, so that a cell cut on a machine that then goes back can be
# carried again with them (its model is the one carried in); an unfinished cell's training state (train.pt) comes back
# with its checkpoint (a training cut when the machine goes back can resume elsewhere); NOCARRY=1 leaves .carry's
# checkpoints out of that call's store (a sweep run side by side with one that carries a model).
# Session 35: (1) STAGES=ARCHIVE puts the run files of a committed device archive (ARCHIVE's */runs/*.parquet) into the
# call's store before `cell` runs its sweep, so a cell whose earlier stages ran on another machine resumes from its
# carried checkpoint instead of training them again, e.g. session 35's MQRAR cells scored on 1,000 samples to 512x:
#   STAGES=results/gpu/device_output/2026-11-25-s35-h100/call2-sb.tar.gz TAG=sb bash $S cell 580 mqrar:stickbreaking:none 5 sweeps/mqrar_depth_l4_1000.toml
#   with .carry/ckpt-mqrar-stickbreaking-none-paper-s5-1850974cde.tar.part-aa carried (13 MB: one model a call fits
#   beside the 52 MB tree; copies in /work/s35art/); a call that cuts it leaves the store on the machine, and the next
#   call there resumes within the length (lengthbench scores resume at the next sample since 70b4f8a) without carrying it again.
# (2) an unfinished cell's checkpoint that comes back holds eval_samples_partial.json too (the tallies of the length it was scoring).
# Session 33's fix: `tests` puts a folder holding only a link to tests/ on PYTHONPATH (session 32's put the
# checkout there, which shadowed the installed package: lengthbench.tasks not found). Session 32's fix: `tests` puts the checkout on PYTHONPATH, so that test files importing `tests.cli_helpers` (test_scaled_heads, test_arch) load from /tmp; a second file still needs an absolute path ($PWD/tests/...).
# Session 30: session 29's script (ran as prepared: 2026-11-24-s30-h100/commands.sh), with one more mode:
#   bash results/gpu/device_output/next/commands.sh rescore SECONDS RUN[,RUN...] SAMPLES [MAX_MULTIPLIER]
#       `lengthbench rescore RUN --samples SAMPLES [--max-multiplier M]` for each RUN put back from
#       .carry/ckpt-RUN.tar.part-* into /tmp/gres (e.g. session 30's best 4-layer MQRAR cells,
#       /work/lengthbench-artifacts/s30/, at the seeds' 1,000 samples per length); the new runs' files come back
#       in the archive, and a cut rescoring's finished lengths (logs/*.eval_rows.json)
# Session 29: session 28's script (2026-11-24-s28-h100/commands.sh), but each TAG has its own results store
# (/tmp/gres-TAG; /tmp/gres without TAG): sweeps side by side no longer send back each other's checkpoints, and a
# sweep cut by the limit resumes in the next call under the same TAG.
# Session 27: session 26's script (2026-11-24-s26-h100/commands.sh); PROBES=1 loads the Sieve probe plugin
# (benchmarks/sieve_probes/sieve_variants.py: sieve-temp) in the sweep, its workers and score_paths:
#   PROBES=1 bash $S cell 590 "mqrar:sieve-temp(T=4):none" 0,1 sweeps/mqrar_inline_c12.toml
# Session 26: session 25's script with one more mode:
#   bash $S kbench SECONDS MECHANISMS
#       benchmarks/kernels.py at L 65,536, D 32 (forward, forward+backward, peak memory against SDPA) for the
#       comma-separated MECHANISMS
# Session 25: session 24's script (2026-11-24-s24-h100/commands.sh) with one more mode:
#   bash results/gpu/device_output/next/commands.sh census SECONDS ATTN:PE ROWS [TUNINGS]
#       benchmarks/kernel_breakdown.py on one evaluation sample at 65,536 tokens of the trained model in /tmp/gres
#       (put back from .carry/ckpt-*) under each of TUNINGS, and the row census (--census ROWS: ROWS sampled
#       rows a head of every list forward, benchmarks/row_census.py: why rows stay open)
# nvidia-h100-x1. Session 21's script (2026-11-23-s21-h100/commands.sh), but `breakdown` takes a fourth argument:
#   bash results/gpu/device_output/next/commands.sh tests SECONDS "FILE [ABSOLUTE_FILE ...] [-n WORKERS]" KEXPR
#       pytest on the GPU (from /tmp: the repo's conftest and pyproject), log in tests.tar.gz; a second file
#       needs an absolute path ($PWD/tests/...)
# .carry/ holds the Inductor caches of the paper ASEntmax + NAPE and ASEntmax + RoPE training steps at commit
# 7d5e1b8's models and runner.py (ccache-mqmtar-asentmax-{nape-b128-9b4b61e379,rope-b128-098919912c}.bin.gz.part-aa;
# copies in /work/lengthbench-artifacts/; the key digests lengthbench/models and runner.py: a change there makes
# them stale) and session 19's seed-2 model (ckpt-*.part-a{a,b,c}). The machine goes back after 30 minutes
# held: a cell resumed in a call that would pass that mark is lost (session 21's call 5).
#   bash results/gpu/device_output/next/commands.sh breakdown SECONDS ATTN:PE [TUNINGS]
#       benchmarks/kernel_breakdown.py on one evaluation sample at 65,536 tokens of the trained model in
#       /tmp/gres (put back from .carry/ckpt-*), then of softmax + RoPE and the same mechanism with fresh weights;
#       TUNINGS (JSON, default null) is --entmax-tunings, e.g. '[null, {"alibi_skip": true}]'
# Session 22: TAG=NAME names a run's folder and archive (default: its kind), so that two `tests` share a call;
# LENGTHBENCH_ENTMAX_DEFAULTS='{"alibi_skip": true}' runs the entmax kernels with the skip on under the tests'
# own TUNING (kernels/entmax.py), and goes into the header.
# Otherwise as session 18's:
# - compile caches that come back: gzipped, in 15 MiB parts (session 18's 44-61 MiB files were over the 16 MiB a
#   file may have), named ccache-NAME.bin.gz.part-??; put them in .carry/ as they are (a call reassembles them).
#   The working tree that travels holds about 23 MiB already (of 64): carry a cache or a model's parts, not both.
# - `cell` scores each run that finished in the call through its fused ops and its dense references at 1x-8x
#   (benchmarks/score_paths.py), if 90 s are left.
# - the default sweep is sweeps/mqmtar_r6_reference.toml (r6 with train_attention = "reference": the compiled
#   dense references, the only way such a cell fits a call; the default since session 18 is the fused ops).
#   bash results/gpu/device_output/next/commands.sh warm SECONDS CELLS [SWEEP]
#   bash results/gpu/device_output/next/commands.sh cell SECONDS CELLS SEEDS [SWEEP]
#   bash results/gpu/device_output/next/commands.sh evaltime SECONDS ATTN:PE SAMPLES [TUNING]
#       on the same machine after a cell: the evaluation time at 65,536 tokens of its trained model
#       (benchmarks/eval_time.py --runs /tmp/gres; TUNING its --entmax-tuning), beside softmax + RoPE's (fresh
#       weights, 100 samples); with .carry/ckpt-* it times session 19's seed 2 (evaltime 400 asentmax:nape 1000
#       '{"alibi_skip": true}': session 20 took 174.4 s without it)
# Fire each call as soon as the last one returns: the machine (and /tmp/gres, /tmp/ccache) stays only 30 s idle.
set -u
what=$1; limit=$2; cells=$3
deadline=$(( $(date +%s) + limit ))
left() { echo $(( deadline - $(date +%s) )); }
source scripts/device_env.sh || exit 1
[ "${PROBES:-0}" = 1 ] && export PYTHONPATH=$PWD/benchmarks/sieve_probes${PYTHONPATH:+:$PYTHONPATH} LENGTHBENCH_PLUGINS=sieve_variants
tag=${TAG:-$what}  # TAG=NAME: the call's folder and archive (two runs of one kind in a call)
D=$OUT/$tag; mkdir -p $D
header "$0 $*" > $D/header.txt
echo "LENGTHBENCH_ENTMAX_DEFAULTS=${LENGTHBENCH_ENTMAX_DEFAULTS:-} LENGTHBENCH_PLUGINS=${LENGTHBENCH_PLUGINS:-}" >> $D/header.txt
G=/tmp/gres${TAG:+-$TAG}
mkdir -p $G/checkpoints /tmp/ccache
export LENGTHBENCH_COMPILE_CACHE=/tmp/ccache
for first in .carry/ccache-*.part-aa; do
  [ -f "$first" ] || continue
  name=$(basename "${first%.gz.part-aa}"); name=${name#ccache-}
  [ -f /tmp/ccache/$name ] || { cat "${first%aa}"?? | gunzip > /tmp/ccache/$name && echo "cache put back: $name" >> $D/header.txt; }
done
ls -la /tmp/ccache >> $D/header.txt
carried=""  # the runs put back from .carry: not sent back as unfinished cells (session 22's calls 3-4 did)
for first in .carry/ckpt-*.tar.part-aa; do
  [ -f "$first" ] && [ "${NOCARRY:-0}" != 1 ] || continue  # NOCARRY=1: a sweep side by side with one that carries
  cat "${first%aa}"?? | tar xf - -C $G/checkpoints && echo "put back: $first" >> $D/header.txt
  carried="$carried $(cat "${first%aa}"?? | tar tf - | head -1 | cut -d/ -f1)"
done
if [ -n "${STAGES:-}" ]; then  # the earlier stages' run files, from a committed archive (session 35)
  mkdir -p $G/runs /tmp/stages && tar xzf "$STAGES" -C /tmp/stages --wildcards '*/runs/*.parquet' \
    && for f in /tmp/stages/*/runs/*.parquet; do [ -f $G/runs/$(basename $f) ] || cp $f $G/runs/; done \
    && echo "stage runs put back from $STAGES: $(ls /tmp/stages/*/runs/ | tr '\n' ' ')" >> $D/header.txt
fi
before=$(ls $G/runs/*.parquet 2>/dev/null)
if [ "$what" = tests ]; then
  R=$PWD
  # only the tests folder on the path (for tests.cli_helpers): the checkout itself there would shadow the
  # installed package, whose lengthbench.tasks/models/kernels map to top-level folders (session 33's call 1)
  mkdir -p /tmp/tpath && ln -sfn $R/tests /tmp/tpath/tests
  (cd /tmp && PYTHONPATH=/tmp/tpath${PYTHONPATH:+:$PYTHONPATH} timeout $(( $(left) - 15 )) python3 -m pytest $R/$cells -c $R/pyproject.toml -q -p no:cacheprovider \
    -k "$4" > $D/pytest.txt 2>&1; echo "exit: $?" >> $D/pytest.txt)
elif [ "$what" = evaltime ]; then
  samples=$4
  timeout $(( $(left) - 20 )) python3 benchmarks/eval_time.py --runs $G --attns $cells --samples $samples \
    --entmax-tuning "${5:-null}" --out $D > $D/eval_time_trained.txt 2>&1
  timeout $(( $(left) - 10 )) python3 benchmarks/eval_time.py --attns softmax --samples 100 --out $D/softmax \
    > $D/eval_time_softmax.txt 2>&1
elif [ "$what" = breakdown ]; then  # breakdown SECONDS ATTN:PE: where one evaluation sample's GPU time goes
  tunings=${4:-null}
  timeout $(( $(left) - 20 )) python3 benchmarks/kernel_breakdown.py --model mqmtar --runs $G --attns $cells \
    --length 65536 --samples 1 --entmax-tunings "$tunings" --out $D/trained > $D/breakdown_trained.txt 2>&1
  timeout $(( $(left) - 10 )) python3 benchmarks/kernel_breakdown.py --model mqmtar --attns softmax:rope,$cells \
    --length 65536 --samples 1 --entmax-tunings "$tunings" --out $D/fresh > $D/breakdown_fresh.txt 2>&1
elif [ "$what" = rescore ]; then
  mkdir -p $D/runs
  for run in ${cells//,/ }; do
    [ -f $G/checkpoints/$run/model.pt ] || { echo "no model for $run (carry .carry/ckpt-$run.tar.part-*)" >> $D/rescore.txt; continue; }
    timeout -s INT $(( $(left) - 15 )) lengthbench rescore $run --results $G --samples $4 ${5:+--max-multiplier $5} \
      --quiet >> $D/rescore.txt 2>&1
    echo "exit: $? ($run)" >> $D/rescore.txt
  done
  for f in $G/runs/*.parquet; do
    case "$before" in *$(basename $f)*) ;; *) cp $f $D/runs/;; esac
  done
  mkdir -p $D/logs
  for f in $G/checkpoints/*/eval_rows.json; do
    [ -f $f ] || continue
    case " $carried " in *" $(basename $(dirname $f)) "*) continue;; esac  # the source's own, carried in
    cp $f $D/logs/$(basename $(dirname $f)).eval_rows.json
  done
elif [ "$what" = kbench ]; then
  timeout $(( $(left) - 10 )) python3 benchmarks/kernels.py --lengths 65536 --head-dims 32 --mechanisms $cells \
    --out $D > $D/kbench.txt 2>&1
  echo "exit: $?" >> $D/kbench.txt
elif [ "$what" = census ]; then
  timeout $(( $(left) - 15 )) python3 benchmarks/kernel_breakdown.py --model mqmtar --runs $G --attns $cells \
    --length 65536 --samples 1 --census $4 --entmax-tunings "${5:-null}" --out $D/trained > $D/census.txt 2>&1
  echo "exit: $?" >> $D/census.txt
elif [ "$what" = warm ]; then
  sweep=${4:-sweeps/mqmtar_r6_reference.toml}
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
  seeds=$4; sweep=${5:-sweeps/mqmtar_r6_reference.toml}
  timeout -s INT $(( $(left) - 25 )) lengthbench sweep --config $sweep --cells $cells --seeds $seeds \
    --results $G --quiet > $D/sweep.txt 2>&1
  echo "exit: $?" >> $D/sweep.txt
  mkdir -p $D/runs $D/logs
  cp $G/runs/*.parquet $D/runs/ 2>/dev/null; cp $G/logs/*.log $D/logs/ 2>/dev/null
  for dir in $G/checkpoints/*/; do
    run=$(basename $dir)
    [ -f $dir/model.pt ] || [ -f $dir/train.pt ] || continue
    cp $dir/eval_rows.json $D/logs/$run.eval_rows.json 2>/dev/null
    cp $dir/eval_samples_partial.json $D/logs/$run.eval_samples_partial.json 2>/dev/null
    case " $carried " in *" $run "*) continue;; esac
    if [ -f $G/runs/$run.parquet ]; then
      case "$before" in *$run.parquet*) continue;; esac  # scored in an earlier call
      [ $(left) -gt 90 ] && timeout $(( $(left) - 20 )) python3 benchmarks/score_paths.py --results $G --run $run \
        --multipliers 1,2,4,8 --samples 200 --out $D > $D/score_paths-$run.txt 2>&1
      continue
    fi
    state=""  # its training state only where it is small enough to come back (Sort 25 MB; a paper MQMTAR's is not)
    [ -f $dir/train.pt ] && [ $(stat -c %s $dir/train.pt) -lt 40000000 ] && state=$run/train.pt
    tar cf - -C $G/checkpoints $(cd $G/checkpoints && ls -d $run/model.pt $run/config.json $run/eval_rows.json $run/eval_samples_partial.json $state 2>/dev/null) \
      | split -b 15m - $OUT/ckpt-$run.tar.part-
  done
fi
for f in /tmp/ccache/*.bin; do  # the compile caches this machine holds that were not carried in
  [ -f "$f" ] || continue
  ls .carry/ccache-$(basename $f).gz.part-aa >/dev/null 2>&1 && continue
  gzip -1 -c $f | split -b 15m - $OUT/ccache-$(basename $f).gz.part-
done
for f in $D/*.txt $D/*.log $D/*.md $D/logs/*.log; do [ -f $f ] && { echo "== $f"; tail -14 $f | cut -c1-220; }; done
# at most 8 files come back: the folder travels as one archive
tar czf $OUT/$tag.tar.gz -C $OUT $tag && rm -rf $D
ls -la $OUT | cut -c1-150
