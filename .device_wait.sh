limit=$1; shift
t=0
while [ $t -lt $limit ]; do
  ok=1; for m in "$@"; do [ -e /tmp/res/$m ] || ok=0; done
  [ $ok = 1 ] && break
  sleep 5; t=$((t+5))
done
tail -5 /tmp/driver.log
mkdir -p $OUT; tar czf $OUT/res.tgz -C /tmp res
