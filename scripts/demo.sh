#!/usr/bin/env bash
# The main demo, end to end against the local services (`make demo` starts them and builds):
#   a 4-shard stream; a producer writing self-describing records for 50 keys; two word_count
#   workers (one with 2 spout tasks) sharing the shards through ZooKeeper; a split and a merge
#   mid-run; a deactivate and an activate; `squall status`; then `squall kill`; and a closing line
#   with records produced, processed and lost (must be 0) from `squall audit`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SQUALL_BIN_DIR:-$ROOT/target/debug}"
SQUALL="$BIN/squall"
WORDS="$BIN/examples/word_count"
RUN="$(date +%s)-$RANDOM"
STREAM="demo-$RUN"
TOPOLOGY="wordcount-$RUN"
OUT="$ROOT/.squall/demo/$RUN"
mkdir -p "$OUT"
export SQUALL_ZK_ROOT="${SQUALL_ZK_ROOT:-/squall-demo}"
step() { printf '\n== %s\n' "$*"; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

step "create stream $STREAM with 4 shards"
"$SQUALL" stream create "$STREAM" --shards 4

step "start a producer: 3000 records over 50 keys at 150 records/s"
"$SQUALL" stream put "$STREAM" --count 3000 --keys 50 --rate 150 --manifest "$OUT/manifest.json" >"$OUT/producer.log" 2>&1 &
PRODUCER=$!
PIDS+=("$PRODUCER")

step "start two word_count workers (1 and 2 spout tasks) for topology $TOPOLOGY"
for w in 1 2; do
  RUST_LOG="${RUST_LOG:-warn,squall=info}" "$WORDS" --topology "$TOPOLOGY" --stream "$STREAM" --spout-tasks "$w" \
    --deliveries "$OUT/deliveries-$w.jsonl" >"$OUT/worker-$w.log" 2>&1 &
  PIDS+=("$!")
done
sleep 4

step "split shardId-000000000000 mid-run"
"$SQUALL" stream split "$STREAM" shardId-000000000000
sleep 3
step "merge its two children mid-run"
# the children are whatever Kinesis named them: read them from the stream (hash-range order)
mapfile -t CHILDREN < <("$SQUALL" stream describe "$STREAM" --json | python3 -c '
import json, sys
shards = json.load(sys.stdin)["shards"]
kids = [s for s in shards if s.get("parent_shard_id") == "shardId-000000000000" and not s.get("adjacent_parent_shard_id")]
kids.sort(key=lambda s: int(s["starting_hash_key"]))
print("\n".join(s["shard_id"] for s in kids))')
if [ "${#CHILDREN[@]}" -ne 2 ]; then
  echo "demo: expected 2 children of shardId-000000000000, found ${#CHILDREN[@]}: ${CHILDREN[*]:-none}" >&2
  exit 1
fi
"$SQUALL" stream merge "$STREAM" "${CHILDREN[0]}" "${CHILDREN[1]}"
sleep 2

step "deactivate: the spouts stop fetching (the producer keeps writing)"
"$SQUALL" deactivate "$TOPOLOGY"
sleep 3
step "activate: fetching resumes from the checkpoints"
"$SQUALL" activate "$TOPOLOGY"

step "wait for the producer"
wait "$PRODUCER"
cat "$OUT/producer.log"

step "wait until every record is processed (up to 90 s)"
for _ in $(seq 1 180); do
  if "$SQUALL" audit --manifest "$OUT/manifest.json" --deliveries "$OUT"/deliveries-*.jsonl >/dev/null 2>&1; then break; fi
  sleep 0.5
done

step "status"
"$SQUALL" status "$TOPOLOGY"

step "kill: workers finish in-flight tuples, checkpoint and exit 0"
"$SQUALL" kill "$TOPOLOGY" --wait 10
for p in "${PIDS[@]:1}"; do
  if wait "$p"; then :; else echo "a worker exited with status $?" >&2; exit 1; fi
done
PIDS=()

step "audit"
# the audit exits non-zero on loss: keep its status (the report is printed either way)
AUDIT=0
REPORT="$("$SQUALL" audit --manifest "$OUT/manifest.json" --deliveries "$OUT"/deliveries-*.jsonl)" || AUDIT=$?
echo "$REPORT"
python3 - "$REPORT" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print(f"\ndemo: records produced {r['produced']}, records processed {r['distinct']} "
      f"({r['delivered']} deliveries, {r['duplicates']} duplicates), records lost {r['lost']}, "
      f"per-key order violations {r['order_violations']}")
sys.exit(1 if r["lost"] or r["order_violations"] else 0)
PY
if [ "$AUDIT" -ne 0 ]; then
  echo "demo: squall audit exited with status $AUDIT" >&2
  exit "$AUDIT"
fi
