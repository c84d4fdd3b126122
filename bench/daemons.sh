# Shared by the bench scripts that start daemons on this machine (bench/prefix_cache.sh,
# bench/auto_load.sh): sourced once BUILD and OUT are set. Finds the binaries (BIN) and python
# (PY), makes $OUT/nodes (N), starts the clock (start), splits the CPUs this process may use in
# two halves (P_CPUS for the producer, C_CPUS for the coordinator and consumers), makes a fresh
# cluster secret under $OUT/nodes, stops every daemon started into PIDS on exit, and gives
# pin / wait_file / cpus and the daemons' common flags.

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
BIN=$(cd "$BUILD/bin" && pwd)
mkdir -p "$OUT/nodes"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)

# The CPUs this process may use, split in two halves (comma lists).
read -r P_CPUS C_CPUS < <("$PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); h = len(c) // 2
print(",".join(map(str, c[:h])) or "-", ",".join(map(str, c[h:])))')
pin() {  # pin CPUS ARGV...: taskset and one compute thread per CPU, unless there is one CPU
  # (exec: the daemon keeps the background job's PID, so cleanup reaches it)
  local cpus=$1; shift
  if [ "$cpus" = "-" ]; then exec "$@"; else
    exec taskset -c "$cpus" "$@" --threads "$(tr ',' '\n' <<< "$cpus" | wc -l)"; fi
}
[ "$P_CPUS" = "-" ] && C_CPUS=-

N="$OUT/nodes"
SECRET="$N/cluster-secret"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SECRET"
chmod 600 "$SECRET"
PIDS=()
cleanup() {  # the nodes first, the coordinator last
  for ((k = ${#PIDS[@]} - 1; k >= 0; k--)); do
    kill -TERM "${PIDS[$k]}" 2>/dev/null || true
    wait "${PIDS[$k]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
wait_file() {  # wait_file FILE PID: the file's content once written (the daemon must live)
  for _ in $(seq 1 1200); do
    [ -s "$1" ] && { cat "$1"; return 0; }
    kill -0 "$2" 2>/dev/null || { echo "daemon for $1 exited; log:" >&2; tail -20 "${1%.addr}.log" >&2; return 1; }
    sleep 0.5
  done
  echo "timed out waiting for $1" >&2; return 1
}
common=(--cluster-secret-file "$SECRET" --log-level info)
rm -f "$N"/*.addr
cpus() { [ "$1" = "-" ] || echo taskset -c "$1"; }
# start_consumer NAME BASE / start_producer: a daemon on dummy weights ($CONFIG, its first $LAYERS
# layers) with $ARTIFACT and a $MB MiB prefix cache, registered at $REGISTRY, pinned to its half,
# files $N/BASE.{addr,control.addr,log} ($N/producer.* for the producer, its link at 1 Gbit/s).
start_consumer() {
  pin "$C_CPUS" "$BIN/scd-consumer" --dummy-weights "$CONFIG" --layers $LAYERS --name "$1" \
    --artifact "$ARTIFACT" --listen 127.0.0.1:0 --control-listen 127.0.0.1:0 \
    --transfer-listen 127.0.0.1:0 --coordinator "$REGISTRY" --transport grpc \
    --prefix-cache-mb $MB --address-file "$N/$2.addr" \
    --control-address-file "$N/$2.control.addr" "${common[@]}" > "$N/$2.log" 2>&1 &
  PIDS+=($!)
}
start_producer() {
  pin "$P_CPUS" "$BIN/scd-producer" --dummy-weights "$CONFIG" --layers $LAYERS --name tinyllama \
    --artifact "$ARTIFACT" --control-listen 127.0.0.1:0 --coordinator "$REGISTRY" \
    --transport grpc --link-gbps 1 --prefix-cache-mb $MB \
    --address-file "$N/producer.addr" --control-address-file "$N/producer.control.addr" \
    "${common[@]}" > "$N/producer.log" 2>&1 &
  PIDS+=($!)
}
# wait_ready TARGETS: until a one-token scd request to TARGETS succeeds (every node registered).
wait_ready() {
  for _ in $(seq 1 240); do
    "$BIN/scd-bench" serve --server "$SERVER" --targets "$1" --mode scd --num-prompts 1 \
      --input-len 16 --output-len 1 --vocab-size 32000 --quiet --seed 999 \
      --cache-salt warmup > "$N/ready.txt" 2>&1 && grep -q "Failed streams: *0" "$N/ready.txt" && return 0
    sleep 1
  done
  cat "$N/ready.txt"; return 1
}
# start_coordinator: scd-coordinator pinned with the consumers; sets SERVER and REGISTRY.
start_coordinator() {
  $(cpus "$C_CPUS") "$BIN/scd-coordinator" --listen 127.0.0.1:0 --control-listen 127.0.0.1:0 \
    --address-file "$N/coordinator.addr" --control-address-file "$N/coordinator.control.addr" \
    "${common[@]}" > "$N/coordinator.log" 2>&1 &
  PIDS+=($!)
  SERVER=$(wait_file "$N/coordinator.addr" "${PIDS[-1]}")
  REGISTRY=$(wait_file "$N/coordinator.control.addr" "${PIDS[-1]}")
}
