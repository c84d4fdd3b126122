#!/usr/bin/env bash
# `make k8s-test` (issue 52): deploy/k8s run for real on one machine without a cluster.
#   1. make k8s-check: both overlays rendered, schema-validated, cross-checked (scripts/k8s_check.sh);
#   2. podman and the image, as compose-test makes them (scripts/podman_lib.sh);
#   3. the single-node overlay rendered by kubectl kustomize from a copy with a cluster secret
#      made for this run (never written into the tree) and the image renamed to this run's
#      (kustomize's images transformer); artifacts for both pairs;
#   4. its pods run by `podman kube play`, podman standing in for the kubelet and the
#      controllers where it has no such part (scripts/k8s_podman.py: Secrets in podman's store,
#      Services as DNS aliases, status.podIP, hostPath directories, the probes polled on the
#      kubelet's schedule through grpc.health.v1 -- podman runs none); every pod ready through
#      its startup and readiness probes;
#   5. the official `openai` npm client: models, completions and chat completions, whole and
#      streamed (tests/openai_client_check.mjs), through the coordinator pod;
#   6. a gRPC fan-out (`scd generate`) streaming from both consumer pools (fables, xs) in scd mode;
#   7. the fables consumer pod replaced under a load of 20 streamed completions: a new pod ready
#      first (maxSurge 1, maxUnavailable 0), then the old one deleted while it decodes (preStop,
#      SIGTERM, its drain moving what it cannot finish, exit 0 within the grace period), half the
#      streams sent before the deletion and half during it (the fables pool at $FABLES_CPU of
#      CPU, so that they outlast the preStop pause); every stream ends with all its tokens;
#   8. liveness of every pod, then all of it removed;
#   9. the same overlay with the TLS component (deploy/k8s/components/tls; certificates made for
#      this run by scripts/k8s_tls_secrets.sh): every pod ready through its probes over HTTPS,
#      the nodes checking each other's certificate for scd-node at their pod IPs; plain HTTP and
#      plaintext gRPC refused; the openai client and the gRPC fan-out over TLS, checking the
#      coordinator pod's certificate for the Service name scd-coordinator; then everything
#      removed (pods, claims, secrets, network, images).
#   scripts/k8s_test.sh [BUILD_DIR] [SHARED_DIR]       exit 0: every step held
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build}
SHARED=$(cd "${2:-../shared}" && pwd)
BIN=$ROOT/$BUILD/bin
WORK=$(mktemp -d /tmp/scd-k8s.XXXXXX)
TAG=k8s-test-$$
NETWORK=scdk8s$$
LOAD_STREAMS=20
LOAD_TOKENS=400
FABLES_CPU=150m
step() { echo "[k8s-test] $(date +%T) $*"; }
fail() { echo "[k8s-test] FAILED: $*" >&2; exit 1; }
driver() { /usr/bin/python3 scripts/k8s_podman.py "$@"; }

for b in scd scd-coordinator scd-producer scd-consumer scd-calib; do
  [ -x "$BIN/$b" ] || fail "$BIN/$b missing: run make first"
done

# 1. The static check of both overlays.
step "k8s-check"
bash scripts/k8s_check.sh "$BUILD" >"$WORK/check.log" 2>&1 || { cat "$WORK/check.log"; fail "k8s-check"; }

# 2. Packages, podman's settings, the state to restore.
. scripts/podman_lib.sh
podman_prepare
IMAGE=${SCD_TEST_IMAGE:-localhost/scd-serve:$TAG}
cleanup() {
  local rc=$?
  set +e
  step "cleaning up"
  if [ -f "$WORK/state.json" ]; then
    driver down "$WORK/state.json" --logs "$WORK" || rc=1
  fi
  jobs -p | xargs -r kill 2>/dev/null
  podman_finish $rc k8s-test "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # through cleanup
podman_image "$IMAGE" "$WORK"
modules=$ROOT/$BUILD/node-openai
version() { node -p "require('$modules/node_modules/$1/package.json').version" 2>/dev/null || true; }
if [ "$(version openai)" != 6.30.1 ] || [ "$(version undici)" != 6.29.1 ]; then
  step "npm openai@6.30.1 undici@6.29.1 (the client's HTTPS connections with a CA and a name)"
  mkdir -p "$modules"
  npm install --prefix "$modules" --no-audit --no-fund --loglevel=error openai@6.30.1 undici@6.29.1 >/dev/null
fi

# 3. The overlay rendered for this run; artifacts.
cp -r deploy/k8s "$WORK/k8s"
rm -rf "$WORK/k8s/base/secrets" && mkdir -p "$WORK/k8s/base/secrets"
head -c 32 /dev/urandom | base64 >"$WORK/k8s/base/secrets/cluster-secret"
mkdir -p "$WORK/k8s/overlays/run"
cat >"$WORK/k8s/overlays/run/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../single-node]
images:
  - {name: scd-serve, newName: ${IMAGE%:*}, newTag: ${IMAGE##*:}}
# The fables pool at a fraction of a core for this run: at a whole core its 400-token streams end
# within a second, before a deletion's 5 s preStop pause is over; at $FABLES_CPU they are still
# decoding when SIGTERM comes, so the drain is what the replacement tests.
patches:
  - target: {kind: Deployment, name: scd-consumer-fables}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/resources/limits/cpu
        value: $FABLES_CPU
YAML
kubectl kustomize "$WORK/k8s/overlays/run" >"$WORK/rendered.yaml"
podman_artifacts "$BIN" "$SHARED" "$WORK/artifacts"

# 4. Up: every pod ready through its probes.
up() {  # up RENDERED WHAT: the pods of RENDERED ready; HTTP and GRPC the coordinator pod's
  driver up "$1" --state "$WORK/state.json" --network "$NETWORK" \
    --host-path "/var/lib/scd-serve/models=$SHARED/models" \
    --host-path "/var/lib/scd-serve/artifacts=$WORK/artifacts" || fail "$2 not ready"
  HTTP=$(driver address "$WORK/state.json" scd-coordinator http)
  GRPC=$(driver address "$WORK/state.json" scd-coordinator grpc)
}
step "podman kube play: the single-node overlay"
up "$WORK/rendered.yaml" "pods"
CURL=(curl -fsS -m 5)
URL=http://$HTTP
models() { "${CURL[@]}" "$URL/v1/models" 2>/dev/null | python3 -c \
  'import json,sys; print(" ".join(sorted(m["id"] for m in json.load(sys.stdin)["data"])))' 2>/dev/null || true; }
routable() {
  # waits: the consumers' registrations reaching the coordinator through etcd's watch (ready
  # pods have registered; the watch delivers within a second)
  for _ in $(seq 50); do [ "$(models)" = "fables xs" ] && break; sleep 0.2; done
  [ "$(models)" = "fables xs" ] || fail "consumers not routable (models: $(models))"
}
routable
step "ready and routable: $(models)"

# 5. The official openai client through the coordinator pod.
node tests/openai_client_check.mjs "$modules/node_modules" "$HTTP" fables "Once upon a time" xs scd \
  >"$WORK/openai.json" 2>"$WORK/openai.err" || fail "openai client: $(tail -5 "$WORK/openai.err")"
step "openai client: models, completions and chat completions (whole, streamed), a fan-out, errors"

# 6. A gRPC fan-out from one prefill to both consumer pools.
fanout() {  # fanout [CLIENT FLAGS...]
  "$BIN/scd" generate --server "$GRPC" "$@" --target fables --target xs --mode scd --max-tokens 12 \
    --prompt "Once upon a time, a little bird" --json >"$WORK/fanout.jsonl" 2>"$WORK/fanout.err" ||
    fail "gRPC fan-out: $(cat "$WORK/fanout.err")"
  finished=$(python3 -c '
import json, sys
done = {}
for line in open(sys.argv[1]):
    event = json.loads(line)
    if "finished" in event:
        done[event["target"]] = event["finished"].get("transfer_mode")
print(" ".join(f"{t}:{m}" for t, m in sorted(done.items())))' "$WORK/fanout.jsonl")
  [ "$finished" = "fables:TRANSFER_MODE_SCD xs:TRANSFER_MODE_SCD" ] ||
    fail "fan-out: finished $finished, expected fables and xs in scd mode"
}
fanout
step "gRPC fan-out: fables and xs streamed from one prefill"

# 7. The fables consumer replaced under load.
old=$(/usr/bin/python3 -c 'import json,sys; print(next(p["name"] for p in json.load(open(sys.argv[1]))["pods"] if p["workload"] == "scd-consumer-fables"))' "$WORK/state.json")
new=$(driver surge "$WORK/state.json" scd-consumer-fables | tail -1) || fail "the new fables pod"
old_http=$(/usr/bin/python3 -c 'import json,sys; print(next(p["ip"] for p in json.load(open(sys.argv[1]))["pods"] if p["name"] == sys.argv[2]))' "$WORK/state.json" "$old"):8002
/usr/bin/python3 -c '
import json, sys
print(json.dumps([{"model": "fables", "prompt": [1, 403 + i, 261 + i, 288]} for i in range(int(sys.argv[1]))]))' \
  "$LOAD_STREAMS" >"$WORK/load.json"
half=$((LOAD_STREAMS / 2))
load() {  # load NAME: half of the streams, in the background
  node tests/openai_many_streams.mjs "$modules/node_modules" "$HTTP" "$half" "$LOAD_TOKENS" \
    "$WORK/load.json" >"$WORK/$1.out" 2>"$WORK/$1.err" &
}
load first
first_pid=$!
running() { curl -fsS -m 5 "http://$old_http/metrics" 2>/dev/null |
  awk '/^scd:num_requests_running/ {s+=$2} END {print s+0}'; }
# waits: the first half's streams reaching the old pod (the coordinator spreads them over both)
at_delete=0
for _ in $(seq 100); do at_delete=$(running); [ "$at_delete" -ge 1 ] && break; sleep 0.1; done
[ "$at_delete" -ge 1 ] || fail "no stream running on $old when it was to be deleted"
driver retire "$WORK/state.json" "$old" --logs "$WORK" >"$WORK/retire.log" 2>&1 &
retire_pid=$!
# waits: the second half sent 2 s into the old pod's preStop pause (still routed: some land there
# and are running when SIGTERM comes)
sleep 2
load second
second_pid=$!
wait "$retire_pid" || fail "deleting $old: $(cat "$WORK/retire.log")"
cat "$WORK/retire.log"
wait "$first_pid" && wait "$second_pid" || fail "the load: $(cat "$WORK/first.err" "$WORK/second.err")"
completed=0
for part in first second; do
  read -r done failures < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["completed"], len(r["failures"]))' "$WORK/$part.out")
  [ "$failures" = 0 ] || fail "streams lost in the replacement: $(cat "$WORK/$part.out")"
  completed=$((completed + done))
done
[ "$completed" = "$LOAD_STREAMS" ] || fail "$completed of $LOAD_STREAMS streams completed"
moves=$(curl -fsS -m 5 "http://$HTTP/metrics" | awk '/^scd:stream_moves_total/ {s+=$2} END {print s+0}')
step "fables replaced by $new under $LOAD_STREAMS streams ($at_delete on the old pod when its" \
  "deletion began, $half more sent during it; $moves moved): all ended with $LOAD_TOKENS tokens"
[ "$(models)" = "fables xs" ] || fail "models after the replacement: $(models)"

# 8. Liveness, then down.
driver liveness "$WORK/state.json" || fail "liveness"
driver down "$WORK/state.json" || fail "down"
rm -f "$WORK/state.json"

# 9. The TLS component on the same overlay (the trap then removes pods, secrets, network, images).
step "the TLS component"
certs=$WORK/k8s/components/tls/secrets
bash scripts/k8s_tls_secrets.sh "$certs" default >/dev/null
mkdir -p "$WORK/k8s/overlays/run-tls"
printf 'resources: [../run]\ncomponents: [../../components/tls]\n' \
  >"$WORK/k8s/overlays/run-tls/kustomization.yaml"
kubectl kustomize "$WORK/k8s/overlays/run-tls" >"$WORK/rendered-tls.yaml"
up "$WORK/rendered-tls.yaml" "pods with TLS"
# Clients reach the coordinator pod at its IP and check its certificate for the Service's name.
CURL=(curl -fsS -m 5 --cacert "$certs/ca.crt" --resolve "scd-coordinator:${HTTP##*:}:${HTTP%:*}")
URL=https://scd-coordinator:${HTTP##*:}
routable
step "ready over HTTPS probes and routable: $(models)"
if curl -fsS -m 5 "http://$HTTP/v1/models" >/dev/null 2>&1; then fail "plain HTTP served"; fi
if "$BIN/scd" generate --server "$GRPC" --target fables --max-tokens 2 --prompt Once \
  >/dev/null 2>&1; then fail "a plaintext gRPC client served"; fi
SCD_TLS_CA=$certs/ca.crt SCD_TLS_SERVER_NAME=scd-coordinator \
  node tests/openai_client_check.mjs "$modules/node_modules" "$HTTP" fables "Once upon a time" xs scd \
  >"$WORK/openai-tls.json" 2>"$WORK/openai-tls.err" || fail "openai client over TLS: $(tail -5 "$WORK/openai-tls.err")"
fanout --tls-ca "$certs/ca.crt" --tls-server-name scd-coordinator
step "TLS: plain HTTP and plaintext gRPC refused; the openai client and a gRPC fan-out in scd mode served"
driver liveness "$WORK/state.json" || fail "liveness with TLS"
driver down "$WORK/state.json" || fail "down"
rm -f "$WORK/state.json"
step "passed"
