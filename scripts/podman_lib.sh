# Shared by scripts/compose_test.sh and scripts/k8s_test.sh: real containers on a machine without
# a Docker engine or a cluster -- Debian's podman 4.3 with the project's containers.conf, the
# debian:bookworm base image made locally, the image of the binaries `make` built, artifacts for
# the two pairs, and leaving the machine as it was (images, netavark's iptables chains,
# ip_forward). Source it after `set -euo pipefail` and defining step() and fail(); then
#   podman_prepare WORK       packages, CONTAINERS_CONF, the state to restore
#   podman_image IMAGE WORK   the image (skipped when SCD_TEST_IMAGE names one that exists:
#                             .ci/run builds it once for both tests; this script then leaves it)
#   podman_artifacts BIN SHARED DIR
#                             stories260k-to-fables.scd and stories260k-to-xs.scd (seconds)
#   podman_restore            images this run made, netavark's new chains, ip_forward
#   podman_finish RC NAME WORK
#                             the end of a cleanup trap: podman_restore, WORK kept on failure
#                             (named) or removed, exit RC
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PODMAN_BASE=docker.io/library/debian:bookworm

podman_prepare() {
  local missing=() p
  for p in podman runc uidmap slirp4netns fuse-overlayfs debootstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  # The project's containers.conf (ulimits, runc); the system's is left alone.
  export CONTAINERS_CONF=$ROOT/deploy/podman/containers.conf
  podman_chains_before=$(podman_netavark_chains)
  podman_images_before=$(podman images -a -q --no-trunc 2>/dev/null | sort -u)
  podman_ip_forward_before=$(cat /proc/sys/net/ipv4/ip_forward)
  podman_made_base=0
  podman_made_image=""
}

# "TABLE:CHAIN" of netavark's iptables chains.
podman_netavark_chains() {
  local table
  for table in filter nat; do
    $SUDO iptables -t $table -S 2>/dev/null | awk -v t=$table '$1=="-N" && $2 ~ /^NETAVARK/ {print t":"$2}'
  done | sort
}

podman_image() {
  local image=$1 work=$2 mirror
  if [ -n "${SCD_TEST_IMAGE:-}" ] && [ "$image" = "$SCD_TEST_IMAGE" ] && podman image exists "$image"; then
    step "image $image (made before this test)"
    return
  fi
  if ! podman image exists "$PODMAN_BASE"; then
    mirror=$( (grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources \
                 /etc/apt/sources.list 2>/dev/null || true) | head -1 | awk '{print $2}')
    [ -n "$mirror" ] || fail "no Debian mirror in /etc/apt/sources.list{,.d}"
    step "debootstrap bookworm from $mirror (about a minute)"
    $SUDO debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
      fail "debootstrap (log: $work/debootstrap.log)"
    $SUDO rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/archives/"*.deb
    $SUDO tar -C "$work/rootfs" -c . | podman import - "$PODMAN_BASE" >/dev/null
    $SUDO rm -rf "$work/rootfs"
    podman_made_base=1
  fi
  # The binaries make built; the host's apt cache shared at build time.
  step "building $image"
  podman_made_image=$image
  podman build -f deploy/Dockerfile --build-arg BINARIES=prebuilt \
    -v /var/cache/apt/archives:/var/cache/apt/archives -t "$image" . >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; fail "image build (log: $work/build.log)"; }
}

podman_artifacts() {
  local bin=$1 shared=$2 dir=$3 pair
  mkdir -p "$dir"
  for pair in fables:stories260k-fables xs:llama2xs-260k; do
    "$bin/scd-calib" fit --quiet --producer "$shared/models/stories260k" \
      --consumer "$shared/models/${pair#*:}" --out "$dir/stories260k-to-${pair%%:*}.scd" \
      --prefixes 24 --tokens 64 --rank-k 1 --rank-v 2 --rank-h 16 --patch-budget 1 \
      --aligner-epochs 2 --aligner-seconds 0 --no-vocab-sweep --heldout-windows 4 >/dev/null
  done
  chmod -R a+rX "$dir"
}

podman_restore() {
  local table new_chains chain
  [ -n "$podman_made_image" ] && podman rmi -f "$podman_made_image" >/dev/null 2>&1
  [ "$podman_made_base" = 1 ] && podman rmi -f "$PODMAN_BASE" >/dev/null 2>&1
  # Every image layer this run made (build stages, intermediate layers), newest first.
  comm -13 <(echo "$podman_images_before") <(podman images -a -q --no-trunc 2>/dev/null | sort -u) |
    xargs -r podman rmi -f >/dev/null 2>&1
  # netavark's chains and forwarding, as they were: references to the new chains, then the
  # chains (flushed first: they refer to each other).
  for table in filter nat; do
    new_chains=$(comm -13 <(echo "$podman_chains_before" | grep "^$table:" || true) \
                          <(podman_netavark_chains | grep "^$table:" || true) | cut -d: -f2)
    [ -n "$new_chains" ] || continue
    for chain in $new_chains; do
      $SUDO iptables -t $table -S 2>/dev/null | grep -E -- "-j $chain( |\$)" | grep -v "^-A $chain " |
        sed 's/^-A/-D/' | while read -r rule; do eval "$SUDO iptables -t $table $rule"; done
    done
    for chain in $new_chains; do $SUDO iptables -t $table -F "$chain" 2>/dev/null; done
    for chain in $new_chains; do $SUDO iptables -t $table -X "$chain" 2>/dev/null; done
  done
  echo "$podman_ip_forward_before" | $SUDO tee /proc/sys/net/ipv4/ip_forward >/dev/null
}

podman_finish() {
  local rc=$1 name=$2 work=$3
  podman_restore
  if [ "$rc" -ne 0 ]; then
    echo "[$name] logs kept in $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
