#!/usr/bin/env bash
# One run, one machine: ucx_perftest (the physical ceiling of UCX here) and then the project's
# UCX, gRPC and in-process backends on the same chunk sizes, over loopback. For every size the
# table shows goodput and the ratio to the same-run ucx_perftest bandwidth (tcp and shared memory),
# then the fixed cost of a session carrying one 640-byte chunk end to end (p50 / p99).
#   bash bench/transport.sh [BUILD_DIR]          (make bench-transport)
#   SIZES="1048576 4194304" bash bench/transport.sh
set -euo pipefail
BUILD=${1:-build}
BENCH=$BUILD/bin/scd-transport-bench
SIZES=${SIZES:-"65536 262144 1048576 4194304 16777216 67108864"}
TOTAL=${TOTAL:-1073741824}     # bytes per measurement (at least 8 chunks)
SESSIONS=${SESSIONS:-2000}
PORT=${PORT:-13491}
ROUNDS=${ROUNDS:-5}           # every cell: best and median of ROUNDS alternating measurements
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)"; exit 1; }
[ -x "$BENCH" ] || { echo "$BENCH not built (make build)"; exit 1; }

source "$(dirname "$0")/transport_measure.sh"

# ucx_perftest on UCX_TLS=TLS. EXTRA "-e": endpoints with peer error handling, as the backend's
# (UCX 1.13 then picks other lanes: no posix AM lane; cma for rendezvous only with
# CMA_MEMORY_INVALIDATE=y, which the backend sets).
perftest() {  # TLS SIZE [EXTRA] -> MiB/s
  perftest_mib_s "UCX_TLS=$1${3:+ UCX_CMA_MEMORY_INVALIDATE=y}" "$2" "${3:-}"
}
ours() { ours_mib_s "${4:+UCX_TLS=$4}" "$1" "$2" "$3"; }  # LEVEL BACKEND SIZE [UCX_TLS] -> MiB/s

echo "# $(date -u +%FT%TZ) $(uname -m) $(nproc) cores, UCX $(ucx_info -v | awk '/Version/ {print $3}'), $ROUNDS alternating rounds"
echo "# goodput in MiB/s; ours: (ratio to ucx_perftest ucp_am_bw on the same UCX_TLS / to ucx_perftest -e); gRPC vs tcp"
echo "# link = the backend alone (Link frames); session = + CRC-32C on both sides, credits, ack"
SHM="posix,cma,self"
SHM_E="posix,cma,self,tcp"  # -e cannot connect without a network transport (the backend adds tcp too)
KEYS="p_tcp e_tcp ul_tcp us_tcp p_shm e_shm ul_shm us_shm gl gs is"
declare -A best=() med=()
for size in $SIZES; do
  declare -A m=()
  for ((r = 0; r < ROUNDS; r++)); do  # alternate, so slow phases of a shared machine hit all
    m[p_tcp]+=" $(perftest tcp "$size")"; m[e_tcp]+=" $(perftest tcp "$size" -e)"
    m[ul_tcp]+=" $(ours link ucx "$size" tcp)"; m[us_tcp]+=" $(ours session ucx "$size" tcp)"
    m[p_shm]+=" $(perftest "$SHM" "$size")"; m[e_shm]+=" $(perftest "$SHM_E" "$size" -e)"
    m[ul_shm]+=" $(ours link ucx "$size" "$SHM")"; m[us_shm]+=" $(ours session ucx "$size" "$SHM")"
    m[gl]+=" $(ours link grpc "$size")"; m[gs]+=" $(ours session grpc "$size")"
    m[is]+=" $(ours session inproc "$size")"
  done
  for k in $KEYS; do best[$size.$k]=$(stat best ${m[$k]}); med[$size.$k]=$(stat median ${m[$k]}); done
  unset m
done
table() {  # NAME (best|med)
  local -n v=$2
  echo
  echo "## $1 of $ROUNDS rounds"
  echo "| chunk | perftest tcp | perftest -e tcp | ucx tcp link | ucx tcp session | perftest shm | perftest -e shm | ucx shm link | ucx shm session | grpc link | grpc session | inproc session |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for size in $SIZES; do
    local pt=${v[$size.p_tcp]} et=${v[$size.e_tcp]} ps=${v[$size.p_shm]} es=${v[$size.e_shm]}
    two() { echo "$1 ($(ratio "$1" "$2") / $(ratio "$1" "$3"))"; }
    echo "| $size | $pt | $et | $(two "${v[$size.ul_tcp]}" "$pt" "$et") | $(two "${v[$size.us_tcp]}" "$pt" "$et") | $ps | $es | $(two "${v[$size.ul_shm]}" "$ps" "$es") | $(two "${v[$size.us_shm]}" "$ps" "$es") | ${v[$size.gl]} ($(ratio "${v[$size.gl]}" "$pt")) | ${v[$size.gs]} ($(ratio "${v[$size.gs]}" "$pt")) | ${v[$size.is]} |"
  done
}
table best best
table median med
echo
echo "# fixed cost of a session with one 640 B chunk (header, chunk, trailer, ack), $SESSIONS sessions"
for spec in "ucx tcp" "ucx $SHM" "grpc -" "inproc -"; do
  set -- $spec
  tls=$2; [ "$tls" = "-" ] && tls=""
  line=$(env ${tls:+UCX_TLS=$tls} "$BENCH" --backend "$1" --bytes 640 --iters 8 \
         --sessions "$SESSIONS" --json | grep '^{' | tail -1)
  python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%-6s %-16s p50 %7.1f us  p99 %7.1f us" % (j["backend"], j["ucx_tls"] or "-", j["session_p50_us"], j["session_p99_us"]))' "$line"
done
