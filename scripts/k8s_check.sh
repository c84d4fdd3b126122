#!/usr/bin/env bash
# `make k8s-check` (issue 52): the Kubernetes manifests checked without a cluster. Both overlays of
# deploy/k8s rendered by `kubectl kustomize` (from a copy, with a cluster secret generated for
# this run only), each also with the TLS component added as an operator adds it (certificates
# made for this run by scripts/k8s_tls_secrets.sh), every object validated against the
# Kubernetes schemas (npm kubernetes-models, pinned, installed once into BUILD/node-k8s:
# tests/k8s_validate.mjs), and the rendered objects cross-checked for the wiring pods fail on
# (scripts/k8s_check.py: selectors, ports, references, env, each daemon's flags and config keys
# against its own --help, the TLS files, names and probes).
#   bash scripts/k8s_check.sh [BUILD]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

modules="$build/node-k8s"
want="kubernetes-models@5.1.0 @kubernetes-models/keda@0.4.2 @kubernetes-models/prometheus-operator@6.0.0 yaml@2.9.1"
have=$(node -p "require('./$modules/node_modules/kubernetes-models/package.json').version" 2> /dev/null || true)
if [ "$have" != "5.1.0" ]; then
  mkdir -p "$modules"
  # shellcheck disable=SC2086
  npm install --prefix "$modules" --no-audit --no-fund --loglevel=error $want
fi

cp -r deploy/k8s "$work/k8s"
rm -rf "$work/k8s/base/secrets"
mkdir -p "$work/k8s/base/secrets"
head -c 32 /dev/urandom | base64 > "$work/k8s/base/secrets/cluster-secret"
rm -rf "$work/k8s/components/tls/secrets"
bash scripts/k8s_tls_secrets.sh "$work/k8s/components/tls/secrets" > /dev/null
for overlay in single-node cluster; do
  cp -r "$work/k8s/overlays/$overlay" "$work/k8s/overlays/$overlay-tls"
  printf 'components: [../../components/tls]\n' >> "$work/k8s/overlays/$overlay-tls/kustomization.yaml"
done
for overlay in single-node cluster single-node-tls cluster-tls; do
  kubectl kustomize "$work/k8s/overlays/$overlay" > "$work/$overlay.yaml"
  node tests/k8s_validate.mjs "$modules/node_modules" "$work/$overlay.yaml"
  /usr/bin/python3 scripts/k8s_check.py "$work/$overlay.yaml" --bin "$build/bin"
done
/usr/bin/python3 scripts/k8s_check.py --self-test
echo "k8s-check: both overlays, with TLS and without, render, validate and cross-check"
