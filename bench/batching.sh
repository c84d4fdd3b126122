#!/usr/bin/env bash
# `make bench-batching`: continuous batching's measurements (issue 28, bench/README.md).
#   1. serve: `scd-bench serve --request-rate inf --num-prompts 32 --input-len 64
#      --output-len 128 --max-concurrency C` for C = 1, 2, 4, 8, 16 (two rounds, alternating),
#      each against a fresh `scd serve --all-in-one --capacity 16`:
#        4m-local   tinystories-4m (real weights), local prefill
#        tl-local   the TinyLlama-1.1B shape cut to 4 layers (dummy weights, f32), local
#        4m-scd     tinystories-4m -> tinystories-4m-b (the hard 4M pair) with its fitted
#                   artifact (ARTIFACT_4M; fitted here when missing), mode scd
#   2. mixed: `scd-bench mixed`: 8 decoders (64-token prompts) on the TinyLlama shape (max
#      positions raised to 4,096, as make bench-prefix) while a 2,040-token prompt arrives:
#        mixed-local  a local prefill, `scd serve --all-in-one`
#        mixed-scd    an scd rebuild: the three daemons, the producer pinned to the first half of
#                     the CPUs, coordinator and consumer to the rest (a producer on its own machine)
#   bash bench/batching.sh BUILD SHARED OUT [PART ...]     (parts: the names above)
# BIN_BEFORE=DIR/bin runs part 1 with an earlier build too (the same commands, same run);
# ROUNDS (2), CONCURRENCY ("1 2 4 8 16") and NUM_PROMPTS (32) shape part 1.
set -euo pipefail
BUILD=${1:-build}
SHARED=${2:-../shared}
OUT=${3:-$BUILD/bench-batching}
ONLY=" ${*:4} "
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
BIN=$(cd "$BUILD/bin" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SHARED=$(cd "$SHARED" && pwd)
want() { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]]; }
ROUNDS=${ROUNDS:-2}
CONCURRENCY=${CONCURRENCY:-1 2 4 8 16}
# Prompts per serve run: 32 keeps a 4M run at 3-4 s, too short to separate two builds by 10 %
# (bench/README "Before and after issue 49"); more make each run longer and its rounds closer.
NUM_PROMPTS=${NUM_PROMPTS:-32}
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; PIDS=(); }
trap cleanup EXIT
trap 'exit 130' INT TERM

# serve_all_in_one BIN_DIR NAME ARGS...: starts `scd serve --all-in-one`; its address is then in
# $OUT/NAME.addr (ADDR too).
serve_all_in_one() {
  local bin=$1 name=$2; shift 2
  rm -f "$OUT/$name.addr"
  "$bin/scd" serve --all-in-one --listen 127.0.0.1:0 --address-file "$OUT/$name.addr" \
    --capacity 16 --log-level warn "$@" > /dev/null 2> "$OUT/$name.log" &
  PIDS+=($!)
  for _ in $(seq 1200); do [ -s "$OUT/$name.addr" ] && { ADDR=$(cat "$OUT/$name.addr"); return 0; }; sleep 0.1; done
  echo "scd serve $name did not start; see $OUT/$name.log" >&2; return 1
}

# serve_part NAME MODE VOCAB SERVE_ARGS...: the concurrency table of one server, this build and
# (BIN_BEFORE) the earlier one, rounds alternating and the builds' order alternating with them.
serve_part() {
  local name=$1 mode=$2 vocab=$3; shift 3
  local builds=("after:$BIN")
  [ -n "${BIN_BEFORE:-}" ] && builds+=("before:$BIN_BEFORE")
  for round in $(seq "$ROUNDS"); do
    # Even rounds run the builds in the other order (ABBA): neither build always goes first.
    local order=("${builds[@]}")
    if [ "${#builds[@]}" -eq 2 ] && [ $((round % 2)) -eq 0 ]; then order=("${builds[1]}" "${builds[0]}"); fi
    for entry in "${order[@]}"; do
      local tag=${entry%%:*} bin=${entry#*:}
      serve_all_in_one "$bin" "$name-$tag" "$@"
      local addr=$ADDR
      for c in $CONCURRENCY; do
        echo "== $name ($tag) round $round, concurrency $c" >&2
        "$bin/scd-bench" serve --server "$addr" --targets c --mode "$mode" --request-rate inf \
          --num-prompts "$NUM_PROMPTS" --input-len 64 --output-len 128 --vocab-size "$vocab" \
          --max-concurrency "$c" --quiet --out "$OUT/$name/$tag-r$round-c$c" \
          > "$OUT/$name/$tag-r$round-c$c.txt" 2>&1 || true
      done
      cleanup
    done
  done
}

if want 4m-local; then
  mkdir -p "$OUT/4m-local"
  serve_part 4m-local local 512 --producer-model "$SHARED/models/tinystories-4m" \
    --consumer "c=$SHARED/models/tinystories-4m"
fi
if want tl-local; then
  mkdir -p "$OUT/tl-local"
  serve_part tl-local local 32000 --dummy-weights "$SHARED/configs/tinyllama-1.1b.json" \
    --layers 4 --consumer "c=$SHARED/configs/tinyllama-1.1b.json"
fi
if want 4m-scd; then
  mkdir -p "$OUT/4m-scd"
  ARTIFACT_4M=${ARTIFACT_4M:-$BUILD/demo/tinystories-4m-to-tinystories-4m-b.scd}
  if [ ! -s "$ARTIFACT_4M" ]; then
    echo "== fitting $ARTIFACT_4M (calib/README.md's 4M settings, ~3 minutes)" >&2
    mkdir -p "$(dirname "$ARTIFACT_4M")"
    "$BIN/scd-calib" fit --producer "$SHARED/models/tinystories-4m" \
      --consumer "$SHARED/models/tinystories-4m-b" --out "$ARTIFACT_4M" \
      --rank-k 12 --rank-v 20 --rank-h 64 --patch-budget 3 --aligner-seconds 0 > "$OUT/fit-4m.log"
  fi
  serve_part 4m-scd scd 512 --producer-model "$SHARED/models/tinystories-4m" \
    --consumer "c=$SHARED/models/tinystories-4m-b:$ARTIFACT_4M"
fi

# The TinyLlama shape with 4,096 positions and its synthesized artifact (mixed parts).
CONFIG="$OUT/tinyllama-4096.json"
"$PY" - "$SHARED/configs/tinyllama-1.1b.json" "$CONFIG" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 4096
json.dump(c, open(sys.argv[2], "w"), indent=1)
EOF
ARTIFACT_TL="$OUT/tinyllama-synth.scd"
if want mixed-local || want mixed-scd; then
  [ -s "$ARTIFACT_TL" ] || "$BIN/scd-calib" synth --producer "$CONFIG" --consumer "$CONFIG" \
    --layers 4 --patch-layers 0,3 --recompute-layers 0 --rank-k 16 --rank-v 16 --rank-h 256 \
    --out "$ARTIFACT_TL" > "$OUT/synth.log"
fi
MIXED=(--decoders 8 --decode-prompt-len 64 --decode-tokens 1000 --long-prompt-len 2040
       --vocab-size 32000)
if want mixed-local; then
  echo "== mixed-local" >&2
  serve_all_in_one "$BIN" mixed-local --dummy-weights "$CONFIG" --layers 4 \
    --consumer "c=$CONFIG:$ARTIFACT_TL"
  "$BIN/scd-bench" mixed --server "$ADDR" --target c "${MIXED[@]}" --long-mode local \
    --out "$OUT/mixed-local" | tee "$OUT/mixed-local.txt"
  cleanup
fi
if want mixed-scd; then
  echo "== mixed-scd" >&2
  read -r P_CPUS C_CPUS < <("$PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); h = len(c) // 2
print(",".join(map(str, c[:h])) or "-", ",".join(map(str, c[h:])))')
  # pin CPUS ARGV...: taskset and one compute thread per CPU (exec: cleanup reaches it);
  # pin_only CPUS ARGV...: taskset alone (the coordinator computes nothing: no --threads).
  pin() {
    local cpus=$1; shift
    if [ "$cpus" = "-" ]; then exec "$@"; else
      exec taskset -c "$cpus" "$@" --threads "$(tr ',' '\n' <<< "$cpus" | wc -l)"; fi
  }
  pin_only() {
    local cpus=$1; shift
    if [ "$cpus" = "-" ]; then exec "$@"; else exec taskset -c "$cpus" "$@"; fi
  }
  N="$OUT/mixed-scd-nodes"
  mkdir -p "$N"
  rm -f "$N"/*.addr
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$N/secret"
  common=(--cluster-secret-file "$N/secret" --log-level warn)
  (pin_only "$C_CPUS" "$BIN/scd-coordinator" --listen 127.0.0.1:0 --control-listen 127.0.0.1:0 \
    --address-file "$N/coordinator.addr" --control-address-file "$N/coordinator.control.addr" \
    "${common[@]}" 2> "$N/coordinator.log") &
  PIDS+=($!)
  for _ in $(seq 600); do [ -s "$N/coordinator.control.addr" ] && break; sleep 0.1; done
  control=$(cat "$N/coordinator.control.addr")
  (pin "$P_CPUS" "$BIN/scd-producer" --dummy-weights "$CONFIG" --layers 4 --seed 1 \
    --coordinator "$control" --artifact "$ARTIFACT_TL" "${common[@]}" 2> "$N/producer.log") &
  PIDS+=($!)
  (pin "$C_CPUS" "$BIN/scd-consumer" --dummy-weights "$CONFIG" --layers 4 --seed 2 --name c \
    --coordinator "$control" --artifact "$ARTIFACT_TL" --capacity 16 \
    --listen 127.0.0.1:0 --address-file "$N/c.addr" "${common[@]}" 2> "$N/c.log") &
  PIDS+=($!)
  for _ in $(seq 1200); do [ -s "$N/c.addr" ] && break; sleep 0.1; done
  sleep 3  # registered (heartbeats every 500 ms)
  "$BIN/scd-bench" mixed --server "$(cat "$N/coordinator.addr")" --target c "${MIXED[@]}" \
    --long-mode scd --out "$OUT/mixed-scd" | tee "$OUT/mixed-scd.txt"
  cleanup
fi

# The concurrency tables: output tok/s and median TPOT per C, the median over rounds.
"$PY" - "$OUT" <<'EOF'
import glob, json, os, random, re, statistics, sys
out = sys.argv[1]
for part in ("4m-local", "tl-local", "4m-scd"):
    rows = {}
    tput = {}  # (build, round, C): output tok/s, for the pairs below
    for path in glob.glob(os.path.join(out, part, "*", "serve-inf.json")):
        m = re.match(r"(before|after)-r(\d+)-c(\d+)", os.path.basename(os.path.dirname(path)))
        if not m:
            continue
        j = json.load(open(path))
        rows.setdefault((m.group(1), int(m.group(3))), []).append(
            (j["output_throughput"], j["tpot"]["median_ms"], j["completed"], j["failed"]))
        tput[(m.group(1), int(m.group(2)), int(m.group(3)))] = j["output_throughput"]
    if not rows:
        continue
    print(f"== {part}: output tok/s, median TPOT ms (median of rounds); x: against C = 1")
    for tag in ("before", "after"):
        cs = sorted(c for t, c in rows if t == tag)
        if not cs:
            continue
        base = statistics.median(r[0] for r in rows[(tag, cs[0])])
        base_tpot = statistics.median(r[1] for r in rows[(tag, cs[0])])
        for c in cs:
            tps = statistics.median(r[0] for r in rows[(tag, c)])
            tpot = statistics.median(r[1] for r in rows[(tag, c)])
            failed = sum(r[3] for r in rows[(tag, c)])
            print(f"{tag:>6} C={c:<3} {tps:9.1f} tok/s ({tps / base:4.2f}x)  TPOT {tpot:8.2f} ms "
                  f"({tpot / base_tpot:4.2f}x)  failed {failed}")
    # With BIN_BEFORE: the builds paired round by round (same round, back to back), so a slow
    # phase of the machine falls on both; the median pair and a 90 % bootstrap interval of it.
    rounds = sorted({r for t, r, c in tput if t == "before"})
    cs = sorted({c for t, r, c in tput})
    if not rounds:
        continue
    rng = random.Random(1)
    def interval(v):
        meds = sorted(statistics.median(rng.choices(v, k=len(v))) for _ in range(2000))
        return meds[100], meds[1899]
    print(f"== {part}: after / before per round, median [90 % bootstrap interval]")
    c1 = cs[0]
    for c in cs:
        # after / before at C, and at C = c1 (for the ratio to it), of each round that has all four
        pairs = [(tput[("after", r, c)] / tput[("before", r, c)],
                  tput[("after", r, c1)] / tput[("before", r, c1)]) for r in rounds
                 if all((t, r, k) in tput for t in ("after", "before") for k in (c, c1))]
        if not pairs:
            continue
        lo, hi = interval([p for p, _ in pairs])
        line = f"  C={c:<3} tok/s {statistics.median(p for p, _ in pairs):.3f} [{lo:.3f}, {hi:.3f}]"
        if c != c1:
            scale = [p / p1 for p, p1 in pairs]
            lo, hi = interval(scale)
            line += f"  ratio to C={c1} {statistics.median(scale):.3f} [{lo:.3f}, {hi:.3f}]"
        print(line + f"  ({len(pairs)} rounds)")
EOF
