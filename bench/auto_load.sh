#!/usr/bin/env bash
# `make bench-auto-load`: issue 29's load bench -- where auto pays under load. Four daemons on
# this machine: scd-coordinator, scd-producer (pinned to the first half of the CPUs this process
# may use) and two replicas of one consumer, "tl" (both pinned to the other half), on the
# TinyLlama-1.1B shape cut to 4 layers with seeded dummy weights, a synthesized artifact with a
# frontier (scd-calib synth --frontier), a prefix cache on every node. Then, per mode (local, scd,
# auto), `scd-bench serve` sends NUM requests at RATE requests/s: 1,024-token prompts of which
# the first 768 are a shared prefix, under three tenants' cache salts (fresh ones per mode, so no
# run warms another's caches), OUT_LEN output tokens, goodput against the TTFT and TPOT SLOs.
# Mode "auto-slo" is auto with the TTFT SLO as every request's ttft_slo_ms (auto's objective:
# the best quality predicted to meet it).
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
[ ${#MODES[@]} -gt 0 ] || MODES=(local scd auto auto-slo)
source "$(dirname "$0")/daemons.sh"

CONFIG="$SHARED/configs/tinyllama-1.1b.json"
LAYERS=4
ARTIFACT="$OUT/tinyllama-synth.scd"
[ -s "$ARTIFACT" ] || "$BIN/scd-calib" synth --producer "$CONFIG" --consumer "$CONFIG" \
  --layers $LAYERS --patch-layers 0,3 --recompute-layers 0 --rank-k 16 --rank-v 16 \
  --rank-h 256 --frontier --out "$ARTIFACT" > "$OUT/synth.log"
MB=1024
start_coordinator
NODE_STATS=()
for r in 1 2; do start_consumer tl "tl$r"; done
start_producer
NODE_STATS+=(--node-stats "$(wait_file "$N/producer.control.addr" "${PIDS[-1]}")")
for r in 1 2; do
  NODE_STATS+=(--node-stats "$(wait_file "$N/tl$r.control.addr" "${PIDS[$r]}")")
done
# Every node registered, and every node's speeds measured once (auto predicts from them): a few
# requests of each fixed mode, one at a time, then local prefills beside decoding sequences
# (what a local prefill costs a busy consumer, and how fast it goes there).
wait_ready tl
for mode in local scd; do
  "$BIN/scd-bench" serve --server "$SERVER" --targets tl --mode $mode --num-prompts 4 \
    --input-len "$INPUT_LEN" --output-len 2 --vocab-size 32000 --quiet --seed 998 \
    --max-concurrency 1 --request-rate inf --cache-salt "warm-$mode" > "$N/warm-$mode.txt"
done
"$BIN/scd-bench" serve --server "$SERVER" --targets tl --mode local --num-prompts 6 \
  --input-len "$INPUT_LEN" --output-len 16 --vocab-size 32000 --quiet --seed 999 \
  --max-concurrency 3 --request-rate inf --cache-salt warm-busy > "$N/warm-busy.txt"

for mode in "${MODES[@]}"; do
  echo "== $mode: $NUM requests at $RATE/s, goodput ttft:$TTFT_MS tpot:$TPOT_MS"
  objective=()
  [ "$mode" = auto-slo ] && objective=(--ttft-slo-ms "$TTFT_MS")
  "$BIN/scd-bench" serve --server "$SERVER" --targets tl --mode "${mode%-slo}" "${objective[@]}" \
    --cache-salt "$mode-a,$mode-b,$mode-c" --num-prompts "$NUM" --request-rate "$RATE" \
    --seed 7 --prefix-seed 70 --shared-prefix-len "$SHARED_LEN" --input-len "$INPUT_LEN" --vocab-size 32000 \
    --output-len "$OUT_LEN" --goodput "ttft:$TTFT_MS" "tpot:$TPOT_MS" --quiet \
    "${NODE_STATS[@]}" --cluster-secret-file "$SECRET" --out "$OUT/$mode" > "$OUT/$mode.txt"
  grep -E "Successful|Failed streams|Request goodput|Median TTFT|P90 TTFT|Median TPOT|from (producer|consumer) cache|Prefill tokens" "$OUT/$mode.txt" || true
done
echo "== done in $(( $(date +%s) - start )) s; results in $OUT"
