#!/usr/bin/env bash
# `make bench-sweep`: the README's bandwidth-sweep figures, two runs of `scd-bench sweep`:
#   hard/      the hard pair stories260k -> llama2xs-260k (no shared training) with its fitted
#              artifact: every mode and auto, with fidelity (agreement, first-token KL);
#   tinyllama/ the TinyLlama-1.1B shape cut to 4 layers with seeded dummy weights and a
#              synthesized artifact with a frontier (scd-calib synth --frontier; its KLs made
#              up): every mode and auto, timings at real KV sizes, 1,024-token
#              prompts, no fidelity; over the producer's shaper (tinyllama/shaper) and over a
#              tc-shaped veth between network namespaces (tinyllama/netns, needs root), one run;
#              on a machine with >= 2 CPUs the producer daemon is pinned to the first half of
#              them and the consumer's side to the rest (two machines' worth of separation: the
#              producer's prefill never shares a core with the consumer's rebuild).
# then bench/sweep_check.py prints the acceptance numbers of issue 16 for the TinyLlama run.
#   bash bench/sweep.sh BUILD SHARED HARD_ARTIFACT OUT
set -euo pipefail
BUILD=${1:-build}
SHARED=${2:-../shared}
ARTIFACT=${3:-$BUILD/demo/stories260k-to-llama2xs-260k.scd}
OUT=${4:-$BUILD/bench-sweep}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
mkdir -p "$OUT"
start=$(date +%s)

echo "== hard pair: stories260k -> llama2xs-260k, every mode, with fidelity"
"$BUILD/bin/scd-bench" sweep --producer "$SHARED/models/stories260k" \
  --consumer "xs=$SHARED/models/llama2xs-260k:$ARTIFACT" \
  --modes local,raw,int4,recompute,reuse,scd,auto --bandwidths 0.01,0.1,1,10,100,inf \
  --prompts "$SHARED/data/tinystories_valid_hf.txt" --prompt-words 70 --num-prompts 4 \
  --max-tokens 32 --out "$OUT/hard" > "$OUT/hard.csv"

echo "== TinyLlama-1.1B shape, 4 layers, dummy weights, 1,024-token prompts"
CONFIG="$SHARED/configs/tinyllama-1.1b.json"
# The CPUs this process may use, split in two halves (comma lists).
read -r P_CPUS C_CPUS < <("$PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); h = len(c) // 2
print(",".join(map(str, c[:h])) or "-", ",".join(map(str, c[h:])))')
PIN=()
[ "$P_CPUS" != "-" ] && PIN=(--producer-cpus "$P_CPUS" --consumer-cpus "$C_CPUS")
"$BUILD/bin/scd-calib" synth --producer "$CONFIG" --consumer "$CONFIG" --layers 4 \
  --patch-layers 0,3 --recompute-layers 0 --rank-k 16 --rank-v 16 --rank-h 256 --frontier \
  --out "$OUT/tinyllama-synth.scd"
"$BUILD/bin/scd-bench" sweep --producer "$CONFIG" --consumer "tl=$CONFIG:$OUT/tinyllama-synth.scd" \
  --layers 4 --modes local,raw,int4,recompute,reuse,scd,auto \
  --bandwidths 0.005,0.01,0.1,1,10,inf --prompt-len 1024 --vocab-size 32000 \
  --num-prompts 2 --max-tokens 2 --compute-scale 20000 --link shaper,netns "${PIN[@]}" \
  --out "$OUT/tinyllama" > "$OUT/tinyllama.csv"

"$PY" "$(dirname "$0")/sweep_check.py" "$OUT/tinyllama/shaper"
echo "-- 3. --link netns against --link shaper (median TTFT, same daemons, same run)"
cat "$OUT/tinyllama/link_comparison.csv"
echo "== done in $(( $(date +%s) - start )) s; plots in $OUT/hard and $OUT/tinyllama"
