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
ROUNDS=${ROUNDS:-3}           # every cell is the median of ROUNDS alternating measurements
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)"; exit 1; }
[ -x "$BENCH" ] || { echo "$BENCH not built (make build)"; exit 1; }

iters_for() { local n=$(( TOTAL / $1 )); [ $n -lt 8 ] && n=8; echo $n; }

# ucx_perftest ucp_am_bw over loopback; prints MiB/s ("MB/s" in its table is 2^20 bytes).
perftest() {  # TLS SIZE
  local tls=$1 size=$2 iters; iters=$(iters_for "$size")
  UCX_TLS=$tls ucx_perftest -p $PORT >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  local out
  out=$(UCX_TLS=$tls timeout 120 ucx_perftest 127.0.0.1 -p $PORT -t ucp_am_bw -s "$size" \
        -n "$iters" 2>&1 | awk '/Final:/ {print $6}')
  wait $server 2>/dev/null || true
  PORT=$((PORT + 1))
  echo "${out:-0}"
}

ours() {  # LEVEL BACKEND SIZE [UCX_TLS] -> goodput MiB/s
  local level=$1 backend=$2 size=$3 tls=${4:-} line
  line=$(env ${tls:+UCX_TLS=$tls} "$BENCH" --level "$level" --backend "$backend" --bytes "$size" \
         --iters "$(iters_for "$size")" --sessions 0 --json 2>/dev/null | grep '^{' | tail -1)
  python3 -c 'import json,sys; print("%.0f" % json.loads(sys.argv[1])["goodput_mib_s"])' "$line"
}
ratio() { python3 -c "import sys; a,b=map(float,sys.argv[1:]); print('%.0f%%' % (100*a/b if b else 0))" "$1" "$2"; }

echo "# $(date -u +%FT%TZ) $(uname -m) $(nproc) cores, UCX $(ucx_info -v | awk '/Version/ {print $3}')"
echo "# medians of $ROUNDS alternating rounds; goodput in MiB/s (ratio to the same-run ucx_perftest ucp_am_bw on the same UCX_TLS; gRPC vs tcp)"
echo "# link = the backend alone (Link frames); session = + CRC-32C on both sides, credits, ack"
echo "| chunk | perftest tcp | ucx tcp link | ucx tcp session | perftest shm | ucx shm link | ucx shm session | grpc link | grpc session | inproc session |"
echo "|---|---|---|---|---|---|---|---|---|---|"
SHM="posix,cma,self"
median() { python3 -c 'import statistics,sys; print("%.0f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }
for size in $SIZES; do
  declare -A m=()
  for ((r = 0; r < ROUNDS; r++)); do  # alternate, so slow phases of a shared machine hit all
    m[p_tcp]+=" $(perftest tcp "$size")"
    m[ul_tcp]+=" $(ours link ucx "$size" tcp)"; m[us_tcp]+=" $(ours session ucx "$size" tcp)"
    m[p_shm]+=" $(perftest "$SHM" "$size")"
    m[ul_shm]+=" $(ours link ucx "$size" "$SHM")"; m[us_shm]+=" $(ours session ucx "$size" "$SHM")"
    m[gl]+=" $(ours link grpc "$size")"; m[gs]+=" $(ours session grpc "$size")"
    m[is]+=" $(ours session inproc "$size")"
  done
  for k in p_tcp ul_tcp us_tcp p_shm ul_shm us_shm gl gs is; do
    printf -v "$k" '%s' "$(median ${m[$k]})"
  done
  unset m
  echo "| $size | $p_tcp | $ul_tcp ($(ratio "$ul_tcp" "$p_tcp")) | $us_tcp ($(ratio "$us_tcp" "$p_tcp")) | $p_shm | $ul_shm ($(ratio "$ul_shm" "$p_shm")) | $us_shm ($(ratio "$us_shm" "$p_shm")) | $gl ($(ratio "$gl" "$p_tcp")) | $gs ($(ratio "$gs" "$p_tcp")) | $is |"
done
echo
echo "# fixed cost of a session with one 640 B chunk (header, chunk, trailer, ack), $SESSIONS sessions"
for spec in "ucx tcp" "ucx $SHM" "grpc -" "inproc -"; do
  set -- $spec
  tls=$2; [ "$tls" = "-" ] && tls=""
  line=$(env ${tls:+UCX_TLS=$tls} "$BENCH" --backend "$1" --bytes 640 --iters 8 \
         --sessions "$SESSIONS" --json | grep '^{' | tail -1)
  python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%-6s %-16s p50 %7.1f us  p99 %7.1f us" % (j["backend"], j["ucx_tls"] or "-", j["session_p50_us"], j["session_p99_us"]))' "$line"
done
