#!/usr/bin/env bash
# The files deploy/k8s/components/tls makes its Secret from, for a trial or a test: a new CA and
# the nodes' certificate signed by it (ECDSA P-256, a year), named for
#   scd-node                     the name nodes check each other's certificates for
#                                (the component's --tls-server-name)
#   scd-coordinator[.NS.svc[.cluster.local]]   the coordinator Service, as clients dial it
#   scripts/k8s_tls_secrets.sh DIR [NAMESPACE ...]   (default namespaces: scd and default)
# writes DIR/ca.crt, DIR/tls.crt, DIR/tls.key and DIR/ca.key (the CA's key: keep it elsewhere, or
# delete it; the Secret does not need it). In production the certificate comes from the cluster's
# CA (cert-manager: a Certificate with these dnsNames and secretName scd-tls).
set -euo pipefail
dir=${1:?usage: k8s_tls_secrets.sh DIR [NAMESPACE ...]}
shift
if [ $# -gt 0 ]; then namespaces=("$@"); else namespaces=(scd default); fi
for ns in "${namespaces[@]}"; do  # DNS labels (RFC 1123), as Kubernetes names namespaces
  [[ $ns =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || { echo "not a namespace name: '$ns'" >&2; exit 2; }
done
mkdir -p "$dir"
umask 077
san="DNS:scd-node,DNS:scd-coordinator"
for ns in "${namespaces[@]}"; do
  san="$san,DNS:scd-coordinator.$ns.svc,DNS:scd-coordinator.$ns.svc.cluster.local"
done
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key "$dir/ca.key"
openssl req -x509 -new -key "$dir/ca.key" -subj /CN=scd-serve-ca -days 365 -out "$dir/ca.crt" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
key "$dir/tls.key"
openssl req -new -key "$dir/tls.key" -subj /CN=scd-node -out "$dir/tls.csr"
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' \
  "$san" >"$dir/tls.ext"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 365 -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/tls.ext" "$dir/ca.srl"
chmod 0644 "$dir/ca.crt" "$dir/tls.crt"
echo "$dir: ca.crt, tls.crt ($san), tls.key; ca.key"
