#!/usr/bin/env bash
# Output tokens/s of `scd serve --all-in-one` with C requests in flight (issue 14's scenario):
# local mode on llama2xs-260k, 128 greedy tokens per request, C = 1, 2, 4, 8, same run.
#   bash bench/serve_concurrency.sh [BUILD_DIR] [extra scd serve flags, e.g. --threads 1]
set -euo pipefail
BUILD=${1:-build}
shift || true
SHARED=${SCD_SHARED_DIR:-$(dirname "$0")/../../shared}
dir=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$dir"' EXIT
"$BUILD/bin/scd" serve --all-in-one --listen 127.0.0.1:0 --address-file "$dir/addr" \
  --producer-model "$SHARED/models/stories260k" --consumer "xs=$SHARED/models/${CONSUMER_MODEL:-llama2xs-260k}" \
  --capacity 16 --log-level info "$@" 2> "$dir/serve.log" &
server=$!
for _ in $(seq 300); do [ -s "$dir/addr" ] && break; sleep 0.1; done
[ -s "$dir/addr" ] || { cat "$dir/serve.log"; exit 1; }
grep -m1 "threads:" "$dir/serve.log" || true
"$BUILD/bin/scd-serve-bench" --server "$(cat "$dir/addr")" --target xs --mode local \
  --max-tokens 128 --concurrency 1,2,4,8 --seconds ${SECONDS_PER_LEVEL:-5} --rounds ${ROUNDS:-3}
