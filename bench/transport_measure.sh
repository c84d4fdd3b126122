# Sourced by the transport benchmarks (bench/transport.sh, bench/ucx_config_cost.sh): one way to
# measure a cell, so that both tables mean the same thing. Needs BENCH (scd-transport-bench),
# TOTAL (bytes per measurement) and PORT (ucx_perftest's first port).

# Iterations for TOTAL bytes in chunks of SIZE, at least 8.
iters_for() { local n=$(( TOTAL / $1 )); [ $n -lt 8 ] && n=8; echo $n; }

# ucx_perftest ucp_am_bw over loopback, server and client under the same ENV assignments
# ("UCX_TLS=tcp ..."); prints MiB/s ("MB/s" in its table is 2^20 bytes), 0 when it failed.
perftest_mib_s() {  # "ENV..." SIZE [EXTRA]
  local envs=$1 size=$2 extra=${3:-} iters out server; iters=$(iters_for "$size")
  env $envs ucx_perftest -p "$PORT" $extra >/dev/null 2>&1 &
  server=$!
  sleep 0.5  # paces: the server's listener up before the client connects (it prints nothing)
  out=$(env $envs timeout 120 ucx_perftest 127.0.0.1 -p "$PORT" -t ucp_am_bw -s "$size" \
        -n "$iters" $extra 2>&1 | awk '/Final:/ {print $6}')
  wait $server 2>/dev/null || true
  echo "${out:-0}"
}

# The project's backend at LEVEL (link: Link frames alone; session: + CRC-32C, credits, ack);
# prints goodput in MiB/s.
ours_mib_s() {  # "ENV..." LEVEL BACKEND SIZE
  local envs=$1 level=$2 backend=$3 size=$4 line
  line=$(env $envs "$BENCH" --level "$level" --backend "$backend" --bytes "$size" \
         --iters "$(iters_for "$size")" --sessions 0 --json 2>/dev/null | grep '^{' | tail -1)
  python3 -c 'import json,sys; print("%.0f" % json.loads(sys.argv[1])["goodput_mib_s"])' "$line"
}

# best|median of the values that follow.
stat() { python3 -c 'import statistics,sys; f=sys.argv[1]; v=list(map(float, sys.argv[2:])); print("%.0f" % (max(v) if f=="best" else statistics.median(v)))' "$@"; }
# A as a percentage of B.
ratio() { python3 -c "import sys; a,b=map(float,sys.argv[1:]); print('%.0f%%' % (100*a/b if b else 0))" "$1" "$2"; }
