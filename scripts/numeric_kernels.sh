#!/usr/bin/env bash
# Runs the tests labelled `numeric` (floating-point comparisons) again under other BLAS kernels
# and ATen's portable code, so a tolerance tuned to one CPU's kernel fails on the developer's
# machine and in CI, not on a user's CPU (issue 14). Part of `make test`.
#   bash scripts/numeric_kernels.sh [BUILD_DIR]
# Personalities: up to two OpenBLAS cores this CPU can execute at ISA levels other than the one in
# use (`scd kernels --others`: e.g. Sandybridge = AVX without FMA and Prescott = SSE3 on an AVX2
# CPU; Haswell and Sandybridge on an AVX-512 one), then ATEN_CPU_CAPABILITY=default (libtorch's
# non-vectorised elementwise code). A user's OPENBLAS_CORETYPE wins over the kernel check
# (model/blas_kernel.h), so each run really uses the core named.
set -euo pipefail
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
exit $status
