#!/usr/bin/env bash
# Runs the tests labelled `numeric` (floating-point comparisons) again under other BLAS kernels
# and ATen's portable code, so a tolerance tuned to one CPU's kernel fails on the developer's
# machine and in CI, not on a user's CPU (issue 14). Part of `make test`.
#   bash scripts/numeric_kernels.sh [BUILD_DIR]
# Personalities: up to two OpenBLAS cores this CPU can execute at ISA levels other than the one in
# use (`scd kernels --others`: e.g. Sandybridge = AVX without FMA and Prescott = SSE3 on an AVX2
# CPU; Haswell and Sandybridge on an AVX-512 one), then ATEN_CPU_CAPABILITY=default (libtorch's
# non-vectorised elementwise code). A user's OPENBLAS_CORETYPE wins over the kernel check
# (model/blas_kernel.h), so each run really uses the core named. Then this project's own kernels
# (model/cpu_simd.h: packed 8- and 16-bit weights, the skinny GEMM, decode attention) capped at
# AVX2 and at plain C (SCD_KERNEL_ISA), for the tests that run them. A test whose ctest entry
# names its float-comparing cases (SCD_NUMERIC_CASES in tests/CMakeLists.txt) runs only those here.
set -euo pipefail
export SCD_NUMERIC_RERUN=1
BUILD=${1:-build}
JOBS=${JOBS:-2}
mapfile -t cores < <("$BUILD/bin/scd" kernels --others | head -2)
echo "== numeric tests under other kernels ($("$BUILD/bin/scd" kernels | head -1 | sed 's/^in use: *//'))"
if [ ${#cores[@]} -lt 2 ]; then
  echo "numeric_kernels: this CPU offers only ${#cores[@]} other OpenBLAS core(s): ${cores[*]:-none}"
fi
status=0
run() {  # NAME VAR=VALUE
  echo "-- $1"
  if ! env "$2" ctest --test-dir "$BUILD" -L numeric --output-on-failure -j"$JOBS"; then
    echo "numeric_kernels: FAILED under $2" >&2
    status=1
  fi
}
for core in "${cores[@]}"; do run "OpenBLAS core $core" "OPENBLAS_CORETYPE=$core"; done
run "ATen portable code" "ATEN_CPU_CAPABILITY=default"
ours() {  # NAME VAR=VALUE REGEX
  echo "-- $1"
  if ! env "$2" ctest --test-dir "$BUILD" -L numeric -R "$3" --output-on-failure -j"$JOBS"; then
    echo "numeric_kernels: FAILED under $2" >&2
    status=1
  fi
}
ours "our kernels at AVX2" "SCD_KERNEL_ISA=avx2" \
  "packed_weight|forward_batch|skinny_gemm|decode_attention|precision_quality|peer_greedy|model_golden"
ours "our kernels in plain C" "SCD_KERNEL_ISA=scalar" "packed_weight|forward_batch|model_golden"
exit $status
