# session 6, call 4: four MQRAR probes on the seeds' layout (separate, 4 queries), softmax + RoPE, paper preset
# with a 1,000-step warm-up, ~8 minutes each; beside them MQMTAR softmax + NAPE, protocol r6 (paper preset, 10M
# samples, 200 evaluation samples), resumable.
R=/tmp/gres
P="lengthbench run --task mqrar --attn softmax --pe rope --preset paper --train-samples 20000000 --warmup-steps 1000 --max-multiplier 2 --eval-samples 200 --eval-every 2000 --quiet --results $R --resume"
for v in "init-torch:--init torch" "heads8:--heads 8" "d128h8-torch:--d-model 128 --heads 8 --ffn 512 --init torch" "lr3e-3:--lr 3e-3"; do
  name=${v%%:*}; args=${v#*:}
  { echo "command: $P $args"; timeout 470 $P $args; } >> $R/probe-mqrar-$name.txt 2>&1 &
done
M="lengthbench run --task mqmtar --attn softmax --pe nape --preset paper --train-samples 10000000 --eval-samples 200 --eval-every 5000 --quiet --results $R --resume"
{ echo "command: $M"; timeout -s INT 500 $M; } >> $R/probe-mqmtar-softmax-nape.txt 2>&1 &
wait
