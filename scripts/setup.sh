#!/usr/bin/env bash
# Installs every Debian package SCD Serve needs, then configures and builds Release into build/.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#   SCD_SKIP_BUILD=1   install packages only
#   SCD_BUILD_DIR=dir  build directory (default: build)
#   CMAKE_ARGS="..."   extra CMake arguments (e.g. -DTorch_DIR=/opt/libtorch-cuda/share/cmake/Torch)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libopenblas0-pthread
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils
  libspdlog-dev libfmt-dev libabsl-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libutf8proc-dev libssl-dev
  clang libclang-rt-14-dev   # the libFuzzer targets (scripts/fuzz.sh, build-fuzz/)
  util-linux                 # prlimit: the lock-out test limits a daemon's descriptors
  python3-matplotlib         # scd-bench's plots (Debian's /usr/bin/python3)
  iproute2                   # scd-bench sweep --link netns: ip netns, veth, tc
  libboost-dev               # Boost.Beast/Asio: every daemon's HTTP server (OpenAI API, /metrics)
  libcpp-httplib-dev         # HTTP clients: the etcd registry's, tests'
  prometheus-cpp-dev         # base/metrics: prometheus-cpp's core registry and text serializer
  python3-grpcio python3-protobuf   # the Python client example (proto/examples), its test
  python3-jinja2             # chat_template_test: the reference renderer of HF chat templates
  python3-yaml               # make k8s-check: the rendered manifests' cross-checks
  etcd-server                # --registry etcd://: the scale-out test runs a real etcd
  prometheus                 # the metrics test: a real Prometheus scrapes the daemons
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js + npm run the tokenizer differential test against the official HF `tokenizers` package.
# A nodesource nodejs already ships npm; Debian's npm package would conflict with it.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all Debian packages present"
fi

# Without the pthread OpenBLAS, libtorch falls back to reference BLAS (~30x slower matmuls).
if command -v update-alternatives >/dev/null 2>&1; then
  for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
    cand=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas-pthread | head -1 || true)
    [ -n "$cand" ] && $SUDO update-alternatives --set "$alt" "$cand" >/dev/null 2>&1 || true
  done
fi

# llama.cpp, the peer of `make bench-peer` and of tests/peer_greedy_test.cc: node-llama-cpp's
# prebuilt CPU binaries at the version bench/peer/package-lock.json pins (integrity hashes checked;
# no install scripts run, so nothing is downloaded or built beyond the registry's packages).
peer_version=$(node -p "require('./bench/peer/node_modules/node-llama-cpp/package.json').version" 2>/dev/null || true)
if [ "$peer_version" != "3.21.1" ]; then
  echo "[setup] installing the llama.cpp peer (bench/peer: node-llama-cpp 3.21.1)"
  (cd bench/peer && npm ci --ignore-scripts --omit=optional --no-audit --no-fund --loglevel=error)
fi

[ "${SCD_SKIP_BUILD:-0}" = "1" ] && exit 0

BUILD_DIR=${SCD_BUILD_DIR:-build}
JOBS=${SCD_JOBS:-$(nproc)}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
# ccache, when the machine has it, makes rebuilds after a branch switch cheap; never required.
LAUNCHER=()
command -v ccache >/dev/null 2>&1 && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
