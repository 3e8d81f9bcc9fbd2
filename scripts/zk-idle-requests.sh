#!/bin/bash
# Usage (services up, `cargo build --examples --bins` done): scripts/zk-idle-requests.sh word_count|word_count_global N
# idle ZooKeeper requests/s of N workers of an example (no records flowing)
ex=$1; n=$2
S=./target/debug/squall
src=zkm-src-$RANDOM; out=zkm-out-$RANDOM; topo=zkm-$RANDOM
$S stream create $src --shards 4 >/dev/null; $S stream create $out --shards 1 >/dev/null
pids=()
for i in $(seq $n); do
  extra=""; [ $ex = word_count_global ] && extra="--output $out"
  RUST_LOG=warn ./target/debug/examples/$ex --topology $topo --stream $src --zk-root /zkm $extra >/dev/null 2>&1 & pids+=($!)
done
sleep 12
r0=$(echo mntr | nc -q1 127.0.0.1 2181 | awk '/zk_packets_received/{print $2}')
sleep 20
r1=$(echo mntr | nc -q1 127.0.0.1 2181 | awk '/zk_packets_received/{print $2}')
kill ${pids[@]}; wait 2>/dev/null
echo "$ex workers=$n zk_requests_per_s=$(echo "scale=2; ($r1-$r0)/20" | bc)"
$S stream delete $src >/dev/null 2>&1; $S stream delete $out >/dev/null 2>&1; $S stream delete $topo-words >/dev/null 2>&1
