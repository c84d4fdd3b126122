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
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
BIN=$(cd "$BUILD/bin" && pwd)
mkdir -p "$OUT/nodes"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)

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

# The CPUs this process may use, split in two halves (comma lists).
read -r P_CPUS C_CPUS < <("$PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); h = len(c) // 2
print(",".join(map(str, c[:h])) or "-", ",".join(map(str, c[h:])))')
pin() {  # pin CPUS ARGV...: taskset and one compute thread per CPU, unless there is one CPU
  # (exec: the daemon keeps the background job's PID, so cleanup reaches it)
  local cpus=$1; shift
  if [ "$cpus" = "-" ]; then exec "$@"; else
    exec taskset -c "$cpus" "$@" --threads "$(tr ',' '\n' <<< "$cpus" | wc -l)"; fi
}
[ "$P_CPUS" = "-" ] && C_CPUS=-

N="$OUT/nodes"
SECRET="$N/cluster-secret"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SECRET"
chmod 600 "$SECRET"
PIDS=()
cleanup() {  # the nodes first, the coordinator last
  for ((k = ${#PIDS[@]} - 1; k >= 0; k--)); do
    kill -TERM "${PIDS[$k]}" 2>/dev/null || true
    wait "${PIDS[$k]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
wait_file() {  # wait_file FILE PID: the file's content once written (the daemon must live)
  for _ in $(seq 1 1200); do
    [ -s "$1" ] && { cat "$1"; return 0; }
    kill -0 "$2" 2>/dev/null || { echo "daemon for $1 exited; log:" >&2; tail -20 "${1%.addr}.log" >&2; return 1; }
    sleep 0.5
  done
  echo "timed out waiting for $1" >&2; return 1
}
common=(--cluster-secret-file "$SECRET" --log-level info)
MB=1024
rm -f "$N"/*.addr
cpus() { [ "$1" = "-" ] || echo taskset -c "$1"; }
$(cpus "$C_CPUS") "$BIN/scd-coordinator" --listen 127.0.0.1:0 --control-listen 127.0.0.1:0 \
  --address-file "$N/coordinator.addr" --control-address-file "$N/coordinator.control.addr" \
  "${common[@]}" > "$N/coordinator.log" 2>&1 &
PIDS+=($!)
SERVER=$(wait_file "$N/coordinator.addr" $!)
REGISTRY=$(wait_file "$N/coordinator.control.addr" "${PIDS[-1]}")
NODE_STATS=()
for name in a b c; do
  pin "$C_CPUS" "$BIN/scd-consumer" --dummy-weights "$CONFIG" --layers $LAYERS --name $name \
    --artifact "$ARTIFACT" --listen 127.0.0.1:0 --control-listen 127.0.0.1:0 \
    --transfer-listen 127.0.0.1:0 --coordinator "$REGISTRY" --transport grpc \
    --prefix-cache-mb $MB --address-file "$N/$name.addr" \
    --control-address-file "$N/$name.control.addr" "${common[@]}" > "$N/$name.log" 2>&1 &
  PIDS+=($!)
done
pin "$P_CPUS" "$BIN/scd-producer" --dummy-weights "$CONFIG" --layers $LAYERS --name tinyllama \
  --artifact "$ARTIFACT" --control-listen 127.0.0.1:0 --coordinator "$REGISTRY" \
  --transport grpc --link-gbps 1 --prefix-cache-mb $MB \
  --address-file "$N/producer.addr" --control-address-file "$N/producer.control.addr" \
  "${common[@]}" > "$N/producer.log" 2>&1 &
PIDS+=($!)
NODE_STATS+=(--node-stats "$(wait_file "$N/producer.control.addr" "${PIDS[-1]}")")
i=1
for name in a b c; do
  NODE_STATS+=(--node-stats "$(wait_file "$N/$name.control.addr" "${PIDS[$i]}")")
  i=$((i + 1))
done
# Every node registered: the coordinator routes to all three names.
for _ in $(seq 1 240); do
  "$BIN/scd-bench" serve --server "$SERVER" --targets a,b,c --mode scd --num-prompts 1 \
    --input-len 16 --output-len 1 --vocab-size 32000 --quiet --seed 999 \
    --cache-salt warmup > "$N/ready.txt" 2>&1 && grep -q "Failed streams: *0" "$N/ready.txt" && break
  sleep 1
done
grep -q "Failed streams: *0" "$N/ready.txt" || { cat "$N/ready.txt"; exit 1; }

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
