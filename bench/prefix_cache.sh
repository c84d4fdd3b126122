#!/usr/bin/env bash
# `make bench-prefix`: the shared-prefix code cache's acceptance runs (issue 17, bench/README.md).
# Five daemons on this machine: scd-coordinator, scd-producer (pinned to the first half of the
# CPUs this process may use, its link shaped to 1 Gbit/s) and three consumers named a, b, c
# (pinned to the other half), all on the TinyLlama-1.1B shape cut to 8 layers with seeded dummy
# weights, a synthesized artifact (scd-calib synth), a prefix cache on every node; then
# `scd-bench serve --shared-prefix-len 2048 --input-len 2080` runs, one per scenario, each with
# its own cache salt, reading the producer's and the consumers' Stats around it:
#   cold-local       a, local, a fresh salt: the consumer's own prefill of all 2,080 tokens
#   warm-local       a, local, same salt and prefix, other own ids: 2,048 from a's cache
#   other-salt       a, local, same prefix under another salt: no hit (its TTFT shows it)
#   producer-warmup  a, scd: the producer computes the prefix, a rebuilds it
#   producer-hit     b, scd, same salt and prefix: producer hit, consumer b cold
#   consumer-warm    b, scd, same salt and prefix, other own ids: both sides hit, only the
#                    suffix's codes cross
#   fan-out          a,b,c, scd, a new salt and prefix, three requests one after another
# then bench/prefix_check.py prints the acceptance numbers.
#   bash bench/prefix_cache.sh BUILD SHARED OUT [SCENARIO ...]
# (naming scenarios runs only those, in the order above, and skips the check).
set -euo pipefail
BUILD=${1:-build}
SHARED=${2:-../shared}
OUT=${3:-$BUILD/bench-prefix}
ONLY=" ${*:4} "
source "$(dirname "$0")/daemons.sh"

# TinyLlama-1.1B's config with max_position_embeddings 4096: a 2,080-token prompt and its output
# pass 2,048 (RoPE without scaling is defined at every position; dummy weights: timings only).
CONFIG="$OUT/tinyllama-1.1b.json"
"$PY" - "$SHARED/configs/tinyllama-1.1b.json" "$CONFIG" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 4096
json.dump(c, open(sys.argv[2], "w"), indent=1)
EOF
LAYERS=8
ARTIFACT="$OUT/tinyllama-synth.scd"
"$BIN/scd-calib" synth --producer "$CONFIG" --consumer "$CONFIG" --layers $LAYERS \
  --patch-layers 0,7 --recompute-layers 0 --rank-k 16 --rank-v 16 --rank-h 256 \
  --out "$ARTIFACT" > "$OUT/synth.log"
MB=1024
start_coordinator
NODE_STATS=()
for name in a b c; do start_consumer "$name" "$name"; done
start_producer
NODE_STATS+=(--node-stats "$(wait_file "$N/producer.control.addr" "${PIDS[-1]}")")
i=1
for name in a b c; do
  NODE_STATS+=(--node-stats "$(wait_file "$N/$name.control.addr" "${PIDS[$i]}")")
  i=$((i + 1))
done
# Every node registered: the coordinator routes to all three names.
wait_ready a,b,c

run() {  # run NAME TARGETS MODE SALT NUM SEED PREFIX_SEED
  [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]] || return 0
  echo "== $1: --targets $2 --mode $3 --cache-salt $4 --num-prompts $5"
  "$BIN/scd-bench" serve --server "$SERVER" --targets "$2" --mode "$3" --cache-salt "$4" \
    --num-prompts "$5" --seed "$6" --prefix-seed "$7" --shared-prefix-len 2048 --input-len 2080 \
    --vocab-size 32000 --output-len 2 --max-concurrency 1 --request-rate inf --quiet \
    "${NODE_STATS[@]}" --cluster-secret-file "$SECRET" --out "$OUT/$1" > "$OUT/$1.txt"
  grep -E "Successful|Failed streams|Median TTFT|from (producer|consumer) cache|Code payload|Prefill tokens" "$OUT/$1.txt"
}
run cold-local a local s-local 1 11 1
run warm-local a local s-local 3 12 1
run other-salt a local s-other 1 13 1
run producer-warmup a scd s-scd 1 21 2
run producer-hit b scd s-scd 1 22 2
run consumer-warm b scd s-scd 3 23 2
run fan-out a,b,c scd s-fan 3 31 3

[ "$ONLY" = "  " ] && "$PY" "$(dirname "$0")/prefix_check.py" "$OUT"
echo "== done in $(( $(date +%s) - start )) s; results in $OUT"
