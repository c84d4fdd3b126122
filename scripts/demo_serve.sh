#!/usr/bin/env bash
# The serving half of `make demo`: starts `scd serve --all-in-one` (coordinator, producer and two
# consumers in one process, codes over the in-process transport), sends the same prompt through the
# public API in local, raw and scd modes and as a fan-out, prints each streamed continuation with
# its TTFT breakdown and payload bytes, then stops the server with SIGTERM (it drains and exits 0).
#   bash scripts/demo_serve.sh BUILD PRODUCER_DIR CONSUMER_DIR ARTIFACT "PROMPT"
set -euo pipefail
BUILD=$1 PRODUCER=$2 CONSUMER=$3 ARTIFACT=$4 PROMPT=$5
SCD=$BUILD/bin/scd
ADDR=$BUILD/demo/serve.addr LOG=$BUILD/demo/serve.log
rm -f "$ADDR"
"$SCD" serve --all-in-one --producer-model "$PRODUCER" \
  --consumer "xs=$CONSUMER:$ARTIFACT" --consumer "base-copy=$PRODUCER" \
  --listen 127.0.0.1:0 --address-file "$ADDR" --log-level info 2> "$LOG" &
SERVER=$!
trap 'kill -9 $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do [ -s "$ADDR" ] && break; sleep 0.1; done
[ -s "$ADDR" ] || { echo "the server did not start; see $LOG"; exit 1; }
SERVER_ADDR=$(cat "$ADDR")
echo "scd serve --all-in-one on $SERVER_ADDR (log: $LOG)"
for mode in local raw scd; do
  echo
  echo "-- mode $mode: $(basename "$PRODUCER") -> xs ($(basename "$CONSUMER"))"
  "$SCD" generate --server "$SERVER_ADDR" --target xs --mode "$mode" --max-tokens 48 \
    --prompt "$PROMPT" --stats
done
echo
echo "-- fan-out, mode auto: one prefill, two consumers (xs: scd with its artifact; base-copy: raw)"
"$SCD" generate --server "$SERVER_ADDR" --target xs --target base-copy --max-tokens 24 \
  --prompt "$PROMPT" --stats
kill -TERM $SERVER
wait $SERVER
trap - EXIT
echo
echo "server stopped cleanly (SIGTERM: drained, exit 0)"
