#!/usr/bin/env bash
# The main demo: a stream is created, records are put, the stream is described, a shard is split,
# and the stream is described again. Services must be up (`make demo` starts them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SQUALL="${SQUALL_BIN:-$ROOT/target/release/squall}"
STREAM="demo-$(date +%s)-$RANDOM"
step() { printf '\n== %s\n' "$*"; }

step "create stream $STREAM with 2 shards"
"$SQUALL" stream create "$STREAM" --shards 2
step "put 1000 records over 20 keys"
"$SQUALL" stream put "$STREAM" --count 1000 --keys 20 --manifest "$ROOT/.squall/demo-manifest.json"
step "describe"
"$SQUALL" stream describe "$STREAM"
step "split shardId-000000000000"
"$SQUALL" stream split "$STREAM" shardId-000000000000
step "describe again: the children name their parent"
"$SQUALL" stream describe "$STREAM"
step "done (stream $STREAM left in place; delete it with: squall stream delete $STREAM)"
