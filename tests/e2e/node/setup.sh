#!/usr/bin/env bash
# Installs what the suite's real node runs beside the kubelet (tests/e2e/kubelet.py):
# containerd with its CRI plugin, runc, the CNI plugins and iptables; what builds and unpacks
# the gpuadm image that runs there (image/build.sh, tests/image): mmdebstrap, buildah and
# umoci; and conntrack and ss, with which the benchmark's balancer in the kernel
# (bench/kernel.py, tested in tests/bench) cuts and forgets connections, as kube-proxy does.
# All from Debian's packages. The kubelet itself is built from its Go module with the control
# plane (../controlplane/build.sh).
#
# Safe to run repeatedly: with every command present it does nothing. It needs root (apt-get),
# as the node itself does. The packages' own services are not used: the tests start containerd
# with a configuration and state of their own, and stop it again.
set -euo pipefail

log() { printf 'node/setup.sh: %s\n' "$*" >&2; }

# command -> the Debian package that provides it
declare -A PACKAGES=(
    [containerd]=containerd
    [ctr]=containerd
    [runc]=runc
    [iptables]=iptables
    [/usr/lib/cni/bridge]=containernetworking-plugins
    [/usr/lib/cni/host-local]=containernetworking-plugins
    [mmdebstrap]=mmdebstrap
    [buildah]=buildah
    [umoci]=umoci
    [conntrack]=conntrack
    [ss]=iproute2
)
# Only the benchmark's balancer needs these: without root, their absence is no failure.
declare -A OPTIONAL=([conntrack]=1 [ss]=1)

missing=()
required=()
for thing in "${!PACKAGES[@]}"; do
    if [[ $thing == /* ]]; then
        [[ -x $thing ]] && continue
    else
        command -v "$thing" >/dev/null && continue
    fi
    missing+=("${PACKAGES[$thing]}")
    [[ -n ${OPTIONAL[$thing]:-} ]] || required+=("${PACKAGES[$thing]}")
done

if [[ ${#missing[@]} -eq 0 ]]; then
    log "up to date: containerd, runc, CNI plugins, iptables, mmdebstrap, buildah, umoci," \
        "conntrack, ss"
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    if [[ ${#required[@]} -eq 0 ]]; then
        log "without root, not installing ${missing[*]}: the benchmark balances with a relay"
        exit 0
    fi
    log "the real node needs root, and these packages: ${missing[*]}"
    exit 2
fi

mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
log "installing ${packages[*]}"
apt-get update -qq >&2
# The packages enable their services on install; a machine without systemd running just
# skips that, and a machine with it gets a containerd that the tests do not touch.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
log "installed ${packages[*]}"
