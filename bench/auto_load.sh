#!/usr/bin/env bash
# `make bench-auto-load`: issue 29's load bench -- where auto pays under load. Four daemons on
# this machine: scd-coordinator, scd-producer (pinned to the first half of the CPUs this process
# may use) and two replicas of one consumer, "tl" (both pinned to the other half), on the
# TinyLlama-1.1B shape cut to 4 layers with seeded dummy weights, a synthesized artifact with a
# frontier (scd-calib synth --frontier), a prefix cache on every node. Then, per mode (local, scd,
# auto), `scd-bench serve` sends NUM requests at RATE requests/s: 1,024-token prompts of which
# the first 768 are a shared prefix, under three tenants' cache salts (fresh ones per mode, so no
# run warms another's caches), OUT_LEN output tokens, goodput against the TTFT and TPOT SLOs.
#   bash bench/auto_load.sh BUILD SHARED OUT [RATE NUM OUT_LEN TTFT_MS TPOT_MS MODES...]
set -euo pipefail
BUILD=${1:-build}
SHARED=${2:-../shared}
OUT=${3:-$BUILD/bench-auto-load}
RATE=${4:-1}
NUM=${5:-40}
OUT_LEN=${6:-16}
TTFT_MS=${7:-4000}
TPOT_MS=${8:-300}
MODES=("${@:9}")
INPUT_LEN=${INPUT_LEN:-1024}
SHARED_LEN=${SHARED_LEN:-768}
[ ${#MODES[@]} -gt 0 ] || MODES=(local scd auto)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
BIN=$(cd "$BUILD/bin" && pwd)
mkdir -p "$OUT/nodes"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)

CONFIG="$SHARED/configs/tinyllama-1.1b.json"
LAYERS=4
ARTIFACT="$OUT/tinyllama-synth.scd"
[ -s "$ARTIFACT" ] || "$BIN/scd-calib" synth --producer "$CONFIG" --consumer "$CONFIG" \
  --layers $LAYERS --patch-layers 0,3 --recompute-layers 0 --rank-k 16 --rank-v 16 \
  --rank-h 256 --frontier --out "$ARTIFACT" > "$OUT/synth.log"

# The CPUs this process may use, split in two halves (comma lists).
read -r P_CPUS C_CPUS < <("$PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); h = len(c) // 2
print(",".join(map(str, c[:h])) or "-", ",".join(map(str, c[h:])))')
pin() {  # pin CPUS ARGV...: taskset and one compute thread per CPU, unless there is one CPU
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
for r in 1 2; do
  pin "$C_CPUS" "$BIN/scd-consumer" --dummy-weights "$CONFIG" --layers $LAYERS --name tl \
    --artifact "$ARTIFACT" --listen 127.0.0.1:0 --control-listen 127.0.0.1:0 \
    --transfer-listen 127.0.0.1:0 --coordinator "$REGISTRY" --transport grpc \
    --prefix-cache-mb $MB --address-file "$N/tl$r.addr" \
    --control-address-file "$N/tl$r.control.addr" "${common[@]}" > "$N/tl$r.log" 2>&1 &
  PIDS+=($!)
done
pin "$P_CPUS" "$BIN/scd-producer" --dummy-weights "$CONFIG" --layers $LAYERS --name tinyllama \
  --artifact "$ARTIFACT" --control-listen 127.0.0.1:0 --coordinator "$REGISTRY" \
  --transport grpc --link-gbps 1 --prefix-cache-mb $MB \
  --address-file "$N/producer.addr" --control-address-file "$N/producer.control.addr" \
  "${common[@]}" > "$N/producer.log" 2>&1 &
PIDS+=($!)
NODE_STATS+=(--node-stats "$(wait_file "$N/producer.control.addr" "${PIDS[-1]}")")
for r in 1 2; do
  NODE_STATS+=(--node-stats "$(wait_file "$N/tl$r.control.addr" "${PIDS[$r]}")")
done
# Every node registered, and every node's speeds measured once (auto predicts from them): a few
# requests of each fixed mode, one at a time.
for _ in $(seq 1 240); do
  "$BIN/scd-bench" serve --server "$SERVER" --targets tl --mode scd --num-prompts 1 \
    --input-len 16 --output-len 1 --vocab-size 32000 --quiet --seed 999 \
    --cache-salt warmup > "$N/ready.txt" 2>&1 && grep -q "Failed streams: *0" "$N/ready.txt" && break
  sleep 1
done
grep -q "Failed streams: *0" "$N/ready.txt" || { cat "$N/ready.txt"; exit 1; }
for mode in local scd; do
  "$BIN/scd-bench" serve --server "$SERVER" --targets tl --mode $mode --num-prompts 4 \
    --input-len 1024 --output-len 2 --vocab-size 32000 --quiet --seed 998 \
    --max-concurrency 1 --request-rate inf --cache-salt "warm-$mode" > "$N/warm-$mode.txt"
done

for mode in "${MODES[@]}"; do
  echo "== $mode: $NUM requests at $RATE/s, goodput ttft:$TTFT_MS tpot:$TPOT_MS"
  "$BIN/scd-bench" serve --server "$SERVER" --targets tl --mode "$mode" \
    --cache-salt "$mode-a,$mode-b,$mode-c" --num-prompts "$NUM" --request-rate "$RATE" \
    --seed 7 --prefix-seed 70 --shared-prefix-len "$SHARED_LEN" --input-len "$INPUT_LEN" --vocab-size 32000 \
    --output-len "$OUT_LEN" --goodput "ttft:$TTFT_MS" "tpot:$TPOT_MS" --quiet \
    "${NODE_STATS[@]}" --cluster-secret-file "$SECRET" --out "$OUT/$mode" > "$OUT/$mode.txt"
  grep -E "Successful|Failed streams|Request goodput|Median TTFT|P90 TTFT|Median TPOT|from (producer|consumer) cache|Prefill tokens" "$OUT/$mode.txt" || true
done
echo "== done in $(( $(date +%s) - start )) s; results in $OUT"
