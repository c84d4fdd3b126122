#!/usr/bin/env bash
# Proves docker-compose.yml with real containers on a machine without a Docker engine: podman
# (Debian's) behind its Docker-compatible socket, Debian's docker-compose 1.29 talking to it
# (../shared/docs/containers.md has the sequence and why each setting is needed):
#   1. packages: podman runc uidmap slirp4netns fuse-overlayfs debootstrap, docker-compose
#      (--no-install-recommends: no Docker engine);
#   2. CONTAINERS_CONF=deploy/podman/containers.conf (ulimits, runc), the system's untouched;
#   3. the debian:bookworm base image made locally (debootstrap --variant=minbase from the mirror
#      apt uses, podman import), tagged docker.io/library/debian:bookworm so the Dockerfile is
#      the one a Docker host with a registry builds;
#   4. the image: deploy/Dockerfile with BINARIES=prebuilt (the binaries `make` built; the apt
#      cache is shared with the build so packages are not fetched twice);
#   5. artifacts for the two pairs (scd-calib fit, small settings: seconds);
#   6. `docker-compose up`: etcd, coordinator, producer, consumers fables and xs, Prometheus;
#   7. a streamed OpenAI chat completion (SSE ending in data: [DONE]) and a gRPC fan-out to both
#      consumers in scd mode; a consumer container SIGKILLed leaves routing within its etcd lease
#      and the other still serves; the coordinator's /metrics and Prometheus (every target up,
#      the TTFT count equal to the requests the coordinator finished);
#   8. `docker-compose down`, then everything this run made is removed: containers, network,
#      image (and the base image if this run made it), the podman service, iptables chains
#      netavark added, ip_forward restored.
#   scripts/compose_test.sh [BUILD_DIR] [SHARED_DIR]       exit 0: every step held
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build}
SHARED=$(cd "${2:-../shared}" && pwd)
BIN=$ROOT/$BUILD/bin
PROJECT=scdcompose$$
WORK=$(mktemp -d /tmp/scd-compose.XXXXXX)
IMAGE=localhost/scd-serve:compose-test-$$
step() { echo "[compose-test] $(date +%T) $*"; }
fail() { echo "[compose-test] FAILED: $*" >&2; exit 1; }

for b in scd scd-coordinator scd-producer scd-consumer scd-calib; do
  [ -x "$BIN/$b" ] || fail "$BIN/$b missing: run make first"
done

# 1-2. Packages, the project's containers.conf, the state to restore (scripts/podman_lib.sh).
. scripts/podman_lib.sh
podman_prepare
IMAGE=${SCD_TEST_IMAGE:-$IMAGE}
service_pid=""
cleanup() {
  local rc=$?
  set +e
  step "cleaning up"
  if [ -n "${DOCKER_HOST:-}" ] && [ -f "$WORK/compose.env" ]; then
    (set -a; . "$WORK/compose.env"; docker-compose -p "$PROJECT" down -v --remove-orphans) \
      >"$WORK/down.log" 2>&1
  fi
  podman ps -a --filter "label=com.docker.compose.project=$PROJECT" -q | xargs -r podman rm -f >/dev/null 2>&1
  podman network ls --format '{{.Name}}' | grep "^${PROJECT}_" | xargs -r podman network rm >/dev/null 2>&1
  [ -n "$service_pid" ] && kill "$service_pid" 2>/dev/null && wait "$service_pid" 2>/dev/null
  podman_finish $rc compose-test "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # through cleanup

# 3-4. The base image without a registry; the image (the binaries make built).
podman_image "$IMAGE" "$WORK"

# 5. Artifacts for both pairs (small calibration: seconds).
podman_artifacts "$BIN" "$SHARED" "$WORK/artifacts"

# 6. Up, through podman's Docker-compatible socket.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GRPC_PORT=$(free_port); HTTP_PORT=$(free_port); PROM_PORT=$(free_port)
cat >"$WORK/compose.env" <<ENV
SCD_IMAGE=$IMAGE
SCD_CLUSTER_SECRET=$(head -c 24 /dev/urandom | base64)
SCD_MODELS=$SHARED/models
SCD_ARTIFACTS=$WORK/artifacts
SCD_GRPC_PORT=$GRPC_PORT
SCD_HTTP_PORT=$HTTP_PORT
SCD_PROMETHEUS_PORT=$PROM_PORT
ENV
podman system service --time=0 "unix://$WORK/podman.sock" >"$WORK/service.log" 2>&1 &
service_pid=$!
export DOCKER_HOST=unix://$WORK/podman.sock
for _ in $(seq 100); do [ -S "$WORK/podman.sock" ] && break; sleep 0.1; done
set -a; . "$WORK/compose.env"; set +a
step "docker-compose up (project $PROJECT)"
docker-compose -p "$PROJECT" up -d --no-build >"$WORK/up.log" 2>&1 ||
  { cat "$WORK/up.log"; docker-compose -p "$PROJECT" logs >"$WORK/compose.log" 2>&1; fail "up"; }

HTTP=http://127.0.0.1:$HTTP_PORT
models() { curl -fsS -m 5 "$HTTP/v1/models" 2>/dev/null | python3 -c \
  'import json,sys; print(" ".join(sorted(m["id"] for m in json.load(sys.stdin)["data"])))' 2>/dev/null || true; }
for _ in $(seq 120); do [ "$(models)" = "fables xs" ] && break; sleep 1; done
[ "$(models)" = "fables xs" ] ||
  { docker-compose -p "$PROJECT" logs >"$WORK/compose.log" 2>&1; tail -40 "$WORK/compose.log"; fail "consumers not routable (models: $(models))"; }
step "routable: $(models)"

# 7a. A streamed OpenAI chat completion.
curl -fsS -N -m 60 "$HTTP/v1/chat/completions" -H 'Content-Type: application/json' -d \
  '{"model":"fables","messages":[{"role":"user","content":"Tell me a story about a fox."}],"max_tokens":16,"stream":true,"mode":"scd"}' \
  >"$WORK/chat.sse"
grep -q '"role":"assistant"' "$WORK/chat.sse" || fail "no assistant delta: $(head -c 400 "$WORK/chat.sse")"
[ "$(tail -n 2 "$WORK/chat.sse" | head -n 1)" = "data: [DONE]" ] || fail "the stream does not end in data: [DONE]"
grep -q '"mode":"scd"' "$WORK/chat.sse" || fail "not served in scd mode: $(grep finish_reason "$WORK/chat.sse" | tail -1)"
step "streamed chat completion: $(grep -c '^data: {' "$WORK/chat.sse") chunks, data: [DONE]"

# 7b. A gRPC fan-out to both consumers from one prefill.
"$BIN/scd" generate --server "127.0.0.1:$GRPC_PORT" --target fables --target xs --mode scd \
  --max-tokens 12 --prompt "Once upon a time, a little bird" --json >"$WORK/fanout.jsonl" 2>"$WORK/fanout.err" ||
  fail "gRPC fan-out: $(cat "$WORK/fanout.err")"
finished=$(grep -c '"finished"' "$WORK/fanout.jsonl" || true)
[ "$finished" = 2 ] || fail "fan-out: $finished of 2 targets finished"
step "gRPC fan-out: fables and xs finished"

# 7c. Kill a consumer container: it leaves routing within its lease; the other still serves.
killed_at=$(date +%s)
docker-compose -p "$PROJECT" kill -s SIGKILL xs >/dev/null 2>&1
for _ in $(seq 40); do [ "$(models)" = "fables" ] && break; sleep 0.5; done
gone=$(( $(date +%s) - killed_at ))
[ "$(models)" = "fables" ] || fail "xs still routed ${gone}s after SIGKILL"
[ $gone -le 15 ] || fail "xs left routing after ${gone}s (lease 10 s)"
"$BIN/scd" generate --server "127.0.0.1:$GRPC_PORT" --target fables --max-tokens 4 \
  --prompt "Once" >/dev/null 2>"$WORK/after.err" || fail "fables after the kill: $(cat "$WORK/after.err")"
step "xs SIGKILLed: out of routing after ${gone}s; fables serves"

# 7d. Metrics: the coordinator's /metrics, then Prometheus (every target scraped).
curl -fsS -m 5 "$HTTP/metrics" >"$WORK/metrics.txt"
ttft=$(awk '/^scd:time_to_first_token_seconds_count/ {s+=$2} END {print s+0}' "$WORK/metrics.txt")
[ "$ttft" = 4 ] || fail "coordinator TTFT count $ttft, expected 4 (chat, fan-out x2, after)"
query() { curl -fsS -m 5 "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'; }
prom_ttft=""
for _ in $(seq 60); do
  prom_ttft=$(query 'sum(scd:time_to_first_token_seconds_count{job="coordinator"})' 2>/dev/null || true)
  [ "$prom_ttft" = 4 ] && break
  sleep 1
done
[ "$prom_ttft" = 4 ] || fail "Prometheus: coordinator TTFT count '$prom_ttft', expected 4"
up=$(query 'sum(up{job=~"coordinator|producer"}) + sum(up{job="consumer",instance="fables:8002"})')
[ "$up" = 3 ] || fail "Prometheus: targets up '$up', expected 3"
step "metrics: TTFT count 4 on /metrics and in Prometheus; coordinator, producer, fables up"

# 8. Down (the trap removes the rest).
docker-compose -p "$PROJECT" down -v >"$WORK/down.log" 2>&1 || fail "down"
left=$(podman ps -a --filter "label=com.docker.compose.project=$PROJECT" -q | wc -l)
[ "$left" = 0 ] || fail "$left containers left after down"
rm -f "$WORK/compose.env"
step "passed"
