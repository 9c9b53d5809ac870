# what "bash gpu_call_body.sh" ran in this call (the header of sweep.txt); device H100, session 6, 2026-11-22
# the MQRAR probes write their own runs to /tmp/gres on the device; the call-3 probes resume those of call 2 (--resume)
timeout -s INT 545 lengthbench sweep --config sweeps/sort_r5.toml --cells sort:entmax:rope,sort:entmax:nape --results /tmp/gres --quiet &
P="lengthbench run --task mqrar --attn softmax --pe rope --preset paper --train-samples 20000000 --warmup-steps 1000 --max-multiplier 2 --eval-samples 200 --eval-every 1000 --quiet --results /tmp/gres"
for v in "sep-q16:--param queries=16" "inline-q16:--param queries=16 --param layout=inline"; do
  name=${v%%:*}; args=${v#*:}
  { echo "command: $P $args"; timeout 500 $P $args; } > /tmp/gres/probe-$name.txt 2>&1 &
done
wait
