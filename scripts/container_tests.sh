#!/usr/bin/env bash
# `make container-tests` (what .ci/run runs after `make test`): compose-test and k8s-test on one
# image built once (about 3 minutes saved), then everything this run made removed.
#   scripts/container_tests.sh [BUILD_DIR] [SHARED_DIR]     exit 0: both held
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build}
SHARED=${2:-../shared}
WORK=$(mktemp -d /tmp/scd-containers.XXXXXX)
step() { echo "[container-tests] $(date +%T) $*"; }
fail() { echo "[container-tests] FAILED: $*" >&2; exit 1; }
. scripts/podman_lib.sh
podman_prepare
trap 'podman_restore; rm -rf "$WORK"' EXIT
export SCD_TEST_IMAGE=localhost/scd-serve:container-tests-$$
podman_image "$SCD_TEST_IMAGE" "$WORK"
bash scripts/compose_test.sh "$BUILD" "$SHARED"
bash scripts/k8s_test.sh "$BUILD" "$SHARED"
step "compose-test and k8s-test passed"
