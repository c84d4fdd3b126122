#!/usr/bin/env bash
# The batched decode step (LlamaModel::ForwardBatch) on a CUDA GPU: builds the model runtime alone
# (-DSCD_MODEL_ONLY=ON: base/ tokenizer/ model/ codec/ calib/, forward_batch_test,
# scd_model_bench) against the machine's PyTorch, runs forward_batch_test on the GPU and on the
# CPU (SCD_TEST_DEVICE), then times batched against per-sequence decode steps on the GPU
# (scd_model_bench --batch-report --device cuda), printing markdown tables for bench/README.md.
#
# Two halves, for a GPU machine that has PyTorch, CMake, ninja, a C++ compiler and the CUDA
# toolkit but neither the project's other dependencies nor a network:
#
#   scripts/device_batched_check.sh prepare   here, on Debian 12 (bookworm) with apt: downloads
#       the Debian packages the model build needs into .devdeps/debs (apt-get download: Abseil,
#       spdlog/fmt, nlohmann-json, GoogleTest, Google Benchmark, PCRE2, utf8proc, OpenSSL) and
#       copies what the test and the bench read from the shared folder ($SCD_SHARED_DIR, else
#       ../shared) into .devshared (3 checkpoints with their goldens, ~21 MB, and TinyLlama's
#       config). Both folders belong in .git/info/exclude: they travel as carried paths, never
#       in a commit.
#   scripts/device_batched_check.sh run       there: unpacks the packages into a folder outside
#       the checkout (never into /), configures, builds, tests, times. Logs go to $OUT (default
#       ./device-out); the tables are printed again at the end.
#
# With the device tool: run(command="scripts/device_batched_check.sh run",
# carry=[".devdeps/debs", ".devshared"], timeout_s=420). On one H100/H200 (16 cores) the whole
# run takes a few minutes: the build is most of it.
#
# Environment (run): JOBS (default nproc), SCD_DEVICE_BUILD (build folder, default
# /tmp/scd-build-modelonly), SCD_DEVDEPS_DIR (where the packages are unpacked, default
# /tmp/scd-devdeps), SCD_TORCH_PREFIX (libtorch's CMake prefix, default PyTorch's
# torch.utils.cmake_prefix_path), SCD_WERROR (default OFF), SCD_TEST_DEVICES (default "cuda cpu"),
# SCD_BENCH_DEVICE (default cuda), SCD_BENCH_DTYPES (default f32,bf16), SCD_BENCH_CONTEXT
# (default 512), SCD_BENCH_LAYERS (TinyLlama's layers, default 0: all 22). A dry run on a machine
# without a GPU: SCD_TORCH_PREFIX=/usr SCD_BENCH_DEVICE=cpu SCD_BENCH_LAYERS=1 (the cuda test
# then fails cleanly: no GPU).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
DEBS=$ROOT/.devdeps/debs
SHARED_COPY=$ROOT/.devshared
MODELS=(stories260k llama2xs-260k tinystories-4m)  # forward_batch_test's checkpoints
PACKAGES=(libabsl-dev libabsl20220623 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
          nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
          libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 libssl-dev libssl3)

prepare() {
  local shared=${SCD_SHARED_DIR:-$ROOT/../shared}
  mkdir -p "$DEBS" "$SHARED_COPY/models" "$SHARED_COPY/golden" "$SHARED_COPY/configs"
  (cd "$DEBS" && apt-get download "${PACKAGES[@]}") || return 1
  for m in "${MODELS[@]}"; do
    cp -r "$shared/models/$m" "$SHARED_COPY/models/" || return 1
    cp "$shared/golden/$m.json" "$shared/golden/$m.safetensors" "$SHARED_COPY/golden/" || return 1
  done
  cp "$shared/configs/tinyllama-1.1b.json" "$SHARED_COPY/configs/" || return 1
  chmod -R u+w "$SHARED_COPY"
  for p in .devdeps/ .devshared/; do
    grep -qxF "$p" .git/info/exclude 2> /dev/null || echo "$p" >> .git/info/exclude
  done
  du -sh "$DEBS" "$SHARED_COPY"
}

section() { printf '\n===== %s (%ss)\n' "$1" "$((SECONDS - START))"; }

run() {
  START=$SECONDS
  local out=${OUT:-$ROOT/device-out} jobs=${JOBS:-$(nproc)}
  local build=${SCD_DEVICE_BUILD:-/tmp/scd-build-modelonly} deps=${SCD_DEVDEPS_DIR:-/tmp/scd-devdeps}
  local dtypes=${SCD_BENCH_DTYPES:-f32,bf16} context=${SCD_BENCH_CONTEXT:-512}
  local layers=${SCD_BENCH_LAYERS:-0} bench_device=${SCD_BENCH_DEVICE:-cuda}
  mkdir -p "$out"
  local python=python3
  [ -x /opt/torch/.venv/bin/python3 ] && python=/opt/torch/.venv/bin/python3

  section "machine" | tee "$out/info.log"
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"| gpu:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
    g++ --version | head -1
    cmake --version | head -1
    nvcc --version | tail -1
    echo "cores: $(nproc)"
  } 2>&1 | tee -a "$out/info.log"
  local torch_prefix=${SCD_TORCH_PREFIX:-}
  if [ -z "$torch_prefix" ]; then
    torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  fi

  local debs=("$DEBS"/*.deb)
  section "unpack ${#debs[@]} Debian packages into $deps"
  rm -rf "$deps" && mkdir -p "$deps"
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$deps" || return 1; done
  local cuda_root=""
  [ -d /usr/local/cuda ] && cuda_root="-DCUDAToolkit_ROOT=/usr/local/cuda"

  section "configure" | tee "$out/build.log"
  # CMake 4 refuses package files written for CMake < 3.5; Debian's are newer, but say so.
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  # Debian keeps OpenSSL's configuration headers in the multiarch folder: an -isystem of its own.
  cmake -G Ninja -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSCD_MODEL_ONLY=ON \
    -DSCD_WERROR="${SCD_WERROR:-OFF}" -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" \
    -DOPENSSL_ROOT_DIR="$deps/usr" -DCMAKE_CXX_FLAGS="-isystem $deps/usr/include/x86_64-linux-gnu" \
    $cuda_root 2>&1 | tee -a "$out/build.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { tail -40 "$build/CMakeFiles/CMakeError.log" 2> /dev/null; return 1; }

  section "build (-j$jobs)" | tee -a "$out/build.log"
  local rc
  cmake --build "$build" -j "$jobs" --target forward_batch_test scd_model_bench -- -k 0 \
    >> "$out/build.log" 2>&1
  rc=$?
  grep -E "error|FAILED|Linking" "$out/build.log" | head -60
  echo "warnings: $(grep -c 'warning:' "$out/build.log")"
  grep -A3 'warning:' "$out/build.log" | head -40
  [ $rc -eq 0 ] || { echo "BUILD FAILED (full log: build.log)"; return 1; }

  # Debian's shared libraries (absl, spdlog, fmt, pcre2, utf8proc, libcrypto) for the programs only.
  export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export SCD_SHARED_DIR=$SHARED_COPY
  local status=0
  for device in ${SCD_TEST_DEVICES:-cuda cpu}; do
    section "forward_batch_test on $device"
    SCD_TEST_DEVICE=$device timeout 150 "$build/bin/forward_batch_test" --gtest_color=no \
      > "$out/test_$device.log" 2>&1
    rc=$?
    grep -E "^\[  (PASSED|FAILED) |^\[       OK|^\[  FAILED|largest logit|Failure|Expected|Which is|error" \
      "$out/test_$device.log" | head -60
    echo "forward_batch_test on $device: exit $rc"
    [ $rc -eq 0 ] || status=1
  done

  section "scd_model_bench --batch-report on $bench_device ($dtypes, ${context}-token contexts)"
  timeout 180 "$build/bin/scd_model_bench" --batch-report --device "$bench_device" \
    --dtype "$dtypes" --layers "$layers" --context "$context" --configs "$SHARED_COPY/configs" \
    > "$out/bench.log" 2>&1
  rc=$?
  echo "scd_model_bench: exit $rc"
  [ $rc -eq 0 ] || status=1

  section "summary"
  head -5 "$out/info.log" | tail -4
  grep -E "^\[  (PASSED|FAILED) |largest logit" "$out"/test_*.log
  cat "$out/bench.log"
  return $status
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: $0 prepare|run (see the comment at the top)" >&2
    exit 2
    ;;
esac
