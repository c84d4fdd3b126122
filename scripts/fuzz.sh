#!/usr/bin/env bash
# Fuzzes one parser (or all of them, two at a time) with libFuzzer + AddressSanitizer/LeakSanitizer.
#   bash scripts/fuzz.sh TARGET|all SECONDS [BUILD_DIR]
# TARGET: safetensors artifact code_batch tokenizer gguf_vocab transfer_frame toml_config
#         generate_request http_request node_profile sim_config.
# Builds the fuzz tree (clang, -DSCD_FUZZ=ON, default build-fuzz/) on first use, seeds each
# target's corpus from ../shared (models' safetensors and tokenizer.json files, the tokenizers)
# and from what the tools make (a small safetensors file, a synthetic artifact, a code batch;
# nothing is stored in git), keeps what it finds in BUILD_DIR/corpus/TARGET (reused next run),
# and fails on the first crash, leak, or input that takes over 10 s; the input that failed is kept
# in BUILD_DIR/crashes/TARGET/ and its path printed.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:?usage: fuzz.sh TARGET|all SECONDS [BUILD_DIR]}
SECONDS_EACH=${2:?usage: fuzz.sh TARGET|all SECONDS [BUILD_DIR]}
BUILD=${3:-build-fuzz}
SHARED=${SCD_SHARED_DIR:-../shared}
ALL="safetensors artifact code_batch tokenizer gguf_vocab transfer_frame toml_config generate_request http_request node_profile sim_config"

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" \
    -DCMAKE_CXX_COMPILER=clang++ \
    -DSCD_FUZZ=ON -DSCD_BUILD_TESTS=OFF -DSCD_BUILD_BENCH=OFF \
    $(command -v ccache > /dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) > /dev/null
fi
if [ "$TARGET" = all ]; then targets=$ALL; else targets=$TARGET; fi
names=()
for t in $targets; do names+=("fuzz_$t"); done
cmake --build "$BUILD" --target "${names[@]}"

# A small safetensors file of every dtype class, written by hand (the format: 8-byte header
# length, JSON header, data).
small_safetensors() {
  python3 - "$1" <<'PY'
import json, struct, sys
tensors = {"a": ("F32", [2, 3], struct.pack("<6f", *range(6))), "b": ("BF16", [4], b"\x80\x3f" * 4),
           "c": ("F16", [2, 2], b"\x00\x3c" * 4), "d": ("I64", [1], struct.pack("<q", 7)),
           "e": ("U8", [3], b"abc")}
header, data = {"__metadata__": {"format": "pt"}}, b""
for name, (dtype, shape, raw) in tensors.items():
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(text)) + text + data)
PY
}

# A 2-layer synthetic artifact for the small pair (scd-calib synth of the main build), if built.
small_artifact() {
  local calib=${SCD_BUILD_DIR:-build}/bin/scd-calib
  [ -x "$calib" ] || { echo "(no $calib: the artifact seed is skipped)"; return 0; }
  "$calib" synth --producer "$SHARED/models/stories260k" --consumer "$SHARED/models/llama2xs-260k" \
    --layers 2 --rank-k 2 --rank-v 2 --rank-h 4 --patch-layers 1 --recompute-layers 0 \
    --out "$1" > /dev/null
}

seed() {  # seed DIR TARGET: seeds made from ../shared and by the tools, never stored in git
  local dir=$1 target=$2
  mkdir -p "$dir"
  case $target in
    safetensors)  # the small models' weights, a hand-made file, and an artifact
      for f in "$SHARED"/models/*/*.safetensors; do
        [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 2000000 ] && cp -n "$f" "$dir/$(basename "$(dirname "$f")").safetensors"
      done
      [ -f "$dir/small.safetensors" ] || small_safetensors "$dir/small.safetensors"
      [ -f "$dir/synth.scd" ] || small_artifact "$dir/synth.scd" ;;
    artifact)
      [ -f "$dir/synth.scd" ] || small_artifact "$dir/synth.scd" ;;
    code_batch)
      [ -f "$dir/raw.batch" ] || SCD_FUZZ_WRITE_SEED="$dir/raw.batch" "$BUILD/bin/fuzz_code_batch" ;;
    http_request)  # a completion with a body, a chunked one, a GET with headers
      printf 'POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: 33\r\n\r\n{"model":"m","prompt":"Once up"}\n' > "$dir/post.http"
      printf 'POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n' > "$dir/chunked.http"
      printf 'GET /metrics?x=1 HTTP/1.0\r\nAuthorization: Bearer t\r\nConnection: keep-alive\r\n\r\n' > "$dir/get.http" ;;
    node_profile)  # a consumer's and a producer's profile (bench/node_profile.h)
      printf '[node]\nrole = "consumer"\nmodel = "m"\nmachine = "x"\ncpu_quota = 0.5\n[prefill]\nfixed_us = 100.0\nper_token_us = 9.5\nper_token_context_us = 0.002\n[rebuild]\nfixed_us = 10.0\nper_token_us = 1.5\n[first_decode]\nfixed_us = 400.0\nper_token_us = 0.1\n[decode_step]\nfixed_us = 300.0\nper_sequence_us = 40.0\nper_context_token_us = 0.003\n[interference]\nlocal_itl_us = 2.0\nrebuild_itl_us = 0.5\nbusy_prefill_us = 20.0\n[memory]\nkv_bytes_per_token = 1280\nkv_budget_bytes = 10485760\ncapacity = 16\nstep_rows = 512\n' > "$dir/consumer.toml"
      printf '[node]\nrole = "producer"\nmodel = "m"\n[prefill]\nfixed_us = 80.0\nper_token_us = 11.0\n[encode]\nper_token_us = 0.4\n[link]\ngoodput_gbps = 1e-3\nlatency_us = 50\n' > "$dir/producer.toml" ;;
    sim_config)  # the committed example deployment and workload ('d' / 'w' first), a trace ('t')
      { printf 'd'; cat bench/cluster/example_deployment.toml; } | sed 's#profiles/tinystories-4m.producer.toml#producer#; s#profiles/tinystories-4m-fables.consumer.toml#consumer#' > "$dir/deployment.toml"
      { printf 'w'; cat bench/cluster/example_workload.toml; } > "$dir/workload.toml"
      { printf 'w'; cat bench/cluster/validation/freeze.toml; } > "$dir/faults.toml"
      { printf 'w'; cat bench/cluster/validation/kill.toml; } > "$dir/kills.toml"
      printf 't# a drop and a recovery\n0 1\n2.5 0.01\n4,inf\n' > "$dir/link.trace"
      { cat "$dir/deployment.toml"; printf 'trace = "link.trace"\n'; } > "$dir/traced.toml" ;;
    tokenizer|gguf_vocab)
      for f in "$SHARED"/models/*/tokenizer.json "$SHARED"/tokenizers/*/tokenizer.json "$SHARED"/tokenizers/*.json; do
        [ -f "$f" ] && cp -n "$f" "$dir/$(echo "$f" | tr / _)"
      done ;;
  esac
}

# One target's run; prints its result in one piece (targets run side by side).
fuzz_one() {  # TARGET
  local t=$1 corpus="$BUILD/corpus/$1" seeds="$BUILD/seeds/$1" crashes="$BUILD/crashes/$1"
  local max_len malloc_limit out
  case $t in  # the largest input worth mutating: a small model file, a real tokenizer.json
    safetensors|artifact) max_len=1200000 ;;
    tokenizer|gguf_vocab) max_len=262144 ;;
    *) max_len=65536 ;;
  esac
  # One allocation may reach what the format allows a peer to announce: a transfer chunk up to
  # kMaxFramePayloadBytes (4 GiB; reserved when its first message arrives, touched only as its
  # bytes do; transport/frame.h). Resident memory stays bounded by -rss_limit_mb.
  malloc_limit=2048
  [ "$t" = transfer_frame ] && malloc_limit=4200
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 \
      LSAN_OPTIONS=suppressions="$PWD/tests/lsan.supp" \
      "$BUILD/bin/fuzz_$t" "$corpus" "$seeds" -max_total_time="$SECONDS_EACH" -timeout=10 \
      -rss_limit_mb=4096 -malloc_limit_mb=$malloc_limit -max_len=$max_len -print_final_stats=1 \
      -artifact_prefix="$crashes/" 2> "$BUILD/fuzz_$t.log"; then
    printf '== fuzz_%s FAILED: see %s; the input is in %s/\n%s\n' "$t" "$BUILD/fuzz_$t.log" \
      "$crashes" "$(tail -40 "$BUILD/fuzz_$t.log")"
    return 1
  fi
  out=$(grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$BUILD/fuzz_$t.log" | tr '\n' ' ')
  echo "== fuzz_$t for ${SECONDS_EACH} s (corpus $corpus): $out"
}

# Seeds first (they run the tools), then the targets FUZZ_JOBS at a time (default: one per core,
# at most 2; each target is one single-threaded process), so `all` takes about
# targets x SECONDS / FUZZ_JOBS.
for t in $targets; do
  mkdir -p "$BUILD/corpus/$t" "$BUILD/crashes/$t"
  seed "$BUILD/seeds/$t" "$t"
done
jobs_max=${FUZZ_JOBS:-$(( $(nproc) < 2 ? 1 : 2 ))}
status=0 running=0
for t in $targets; do
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
exit $status
