#!/usr/bin/env bash
# The loaded runs of issue 49: `ctest -j2 -LE latency` RUNS times in a row with two CPU-bound
# processes beside it the whole time (both CPUs of a 2-CPU machine oversubscribed 2x), stopping
# at the first run that fails (the count then starts again).
#   bash scripts/loaded_runs.sh [BUILD] [RUNS] [OUT]       (defaults: build 5 BUILD/loaded-runs)
# Per run OUT keeps ctest's output (run-N.log) and its LastTest.log (run-N.LastTest.log); one line a
# run goes to OUT/summary.txt and to stdout. A run takes 22-24 minutes on the 2-CPU VM. Nothing
# else should run meanwhile (a build beside it is a third load the bar does not name).
# CTEST_ARGS adds ctest arguments (e.g. "-R step_plan" to try the script in seconds).
set -euo pipefail
BUILD=${1:-build}
RUNS=${2:-5}
OUT=${3:-$BUILD/loaded-runs}
BUILD=$(cd "$BUILD" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
read -r -a EXTRA <<< "${CTEST_ARGS:-}"
HOGS=()
CTEST_PID=""
stop_hogs() {
  for h in "${HOGS[@]}"; do kill "$h" 2>/dev/null || true; wait "$h" 2>/dev/null || true; done
  HOGS=()
}
# ctest runs in a process group of its own (setsid), so stopping the script stops its tests too.
stop_all() {
  if [ -n "$CTEST_PID" ]; then kill -TERM -- "-$CTEST_PID" 2>/dev/null || true; fi
  stop_hogs
}
trap stop_all EXIT
trap 'exit 130' INT TERM

for n in $(seq "$RUNS"); do
  for _ in 1 2; do
    (while :; do :; done) &
    HOGS+=($!)
  done
  start=$(date +%s)
  rc=0
  (cd "$BUILD" && exec setsid ctest -j2 -LE latency --output-on-failure "${EXTRA[@]}") \
    > "$OUT/run-$n.log" 2>&1 &
  CTEST_PID=$!
  wait "$CTEST_PID" || rc=$?
  CTEST_PID=""
  stop_hogs
  cp "$BUILD/Testing/Temporary/LastTest.log" "$OUT/run-$n.LastTest.log" 2>/dev/null || true
  result=$(grep -E "tests passed|tests failed" "$OUT/run-$n.log" | tail -1 || true)
  line="run $n: rc $rc, $(($(date +%s) - start)) s, ${result:-no ctest summary}"
  echo "$line" | tee -a "$OUT/summary.txt"
  if [ "$rc" -ne 0 ]; then
    grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted)" "$OUT/run-$n.log" |
      tee -a "$OUT/summary.txt" || true
    echo "run $n failed: the count starts again (see $OUT/run-$n.log)" | tee -a "$OUT/summary.txt"
    exit 1
  fi
done
echo "$RUNS loaded runs in a row green" | tee -a "$OUT/summary.txt"
