#!/usr/bin/env bash
# What keeping UCX's tcp transport off PUT and zero-copy costs (issue 50; transport/ucx/ucx_config.cc
# KeepTcpOffZeroCopy): in one run, alternating, the goodput over tcp on loopback with UCX 1.13's own
# settings ("ucx") and with the backend's ("backend": UCX_TCP_PUT_ENABLE=n, UCX_ZCOPY_THRESH=inf,
# 256 KiB / 512 KiB tcp segments), for ucx_perftest (ucp_am_bw, plain and with peer error handling
# -e, as the backend runs) and for the backend's link and session levels (scd-transport-bench).
# `scd-bench ucx-kills` measures what the settings buy (bench/README.md).
#   bash bench/ucx_config_cost.sh [BUILD_DIR]
#   SIZES="4194304 16777216" ROUNDS=5 bash bench/ucx_config_cost.sh
set -euo pipefail
BUILD=${1:-build}
BENCH=$BUILD/bin/scd-transport-bench
SIZES=${SIZES:-"1048576 4194304 16777216 67108864"}
TOTAL=${TOTAL:-536870912}  # bytes per measurement (at least 8 chunks)
ROUNDS=${ROUNDS:-5}
PORT=${PORT:-13591}
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)"; exit 1; }
[ -x "$BENCH" ] || { echo "$BENCH not built (make build)"; exit 1; }
UCX_OWN="UCX_TCP_PUT_ENABLE=y UCX_ZCOPY_THRESH=auto UCX_TCP_TX_SEG_SIZE=8kb UCX_TCP_RX_SEG_SIZE=64kb"
BACKEND="UCX_TCP_PUT_ENABLE=n UCX_ZCOPY_THRESH=inf UCX_TCP_TX_SEG_SIZE=256kb UCX_TCP_RX_SEG_SIZE=512kb"

source "$(dirname "$0")/transport_measure.sh"
perftest() { perftest_mib_s "UCX_TLS=tcp $1" "$2" "${3:-}"; }  # ENV SIZE [-e] -> MiB/s
ours() { ours_mib_s "UCX_TLS=tcp $1" "$2" ucx "$3"; }             # ENV LEVEL SIZE -> MiB/s

echo "# $(date -u +%FT%TZ) $(nproc) cores, UCX $(ucx_info -v | awk '/Version/ {print $3}'), UCX_TLS=tcp, $ROUNDS alternating rounds, MiB/s"
echo "# ucx = UCX 1.13's own tcp settings; backend = the backend's (backend / ucx in brackets)"
KEYS="pu pb eu eb lu lb su sb"
declare -A best=() med=()
for size in $SIZES; do
  declare -A m=()
  for ((r = 0; r < ROUNDS; r++)); do
    m[pu]+=" $(perftest "$UCX_OWN" "$size")"; m[pb]+=" $(perftest "$BACKEND" "$size")"
    m[eu]+=" $(perftest "$UCX_OWN" "$size" -e)"; m[eb]+=" $(perftest "$BACKEND" "$size" -e)"
    m[lu]+=" $(ours "$UCX_OWN" link "$size")"; m[lb]+=" $(ours "$BACKEND" link "$size")"
    m[su]+=" $(ours "$UCX_OWN" session "$size")"; m[sb]+=" $(ours "$BACKEND" session "$size")"
  done
  for k in $KEYS; do best[$size.$k]=$(stat best ${m[$k]}); med[$size.$k]=$(stat median ${m[$k]}); done
  unset m
done
for which in best med; do
  declare -n v=$which
  echo
  echo "## $([ $which = best ] && echo best || echo median) of $ROUNDS rounds"
  echo "| chunk | perftest ucx | perftest backend | perftest -e ucx | perftest -e backend | link ucx | link backend | session ucx | session backend |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for size in $SIZES; do
    two() { echo "${v[$size.$1]} | ${v[$size.$2]} ($(ratio "${v[$size.$2]}" "${v[$size.$1]}"))"; }
    echo "| $size | $(two pu pb) | $(two eu eb) | $(two lu lb) | $(two su sb) |"
  done
  unset -n v
done
