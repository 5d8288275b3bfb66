#!/usr/bin/env bash
# Builds the kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and etcd
# binaries the end-to-end tests run, from the Go modules pinned in ./apiserver and ./etcd, into a
# per-version cache directory. Safe to run repeatedly: when every binary is
# already present and reports the expected version, nothing is rebuilt.
#
# Progress goes to stderr; the only line on stdout is the bin directory, so
# callers can use "$(build.sh)".
#
# Environment:
#   GPUADM_CACHE  cache root (default: $HOME/.cache/gpuadm)
#   GO            go command to use (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

# Must match the versions pinned in apiserver/go.mod and etcd/go.mod.
KUBE_VERSION=v1.34.4
ETCD_VERSION=v3.6.16
MIN_GO_MINOR=24

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${GPUADM_CACHE:-$HOME/.cache/gpuadm}
OUT_DIR=$CACHE_ROOT/controlplane/k8s-$KUBE_VERSION-etcd-$ETCD_VERSION
BIN_DIR=$OUT_DIR/bin

log() { printf 'controlplane/build.sh: %s\n' "$*" >&2; }

die_no_go() {
    cat >&2 <<EOF
controlplane/build.sh: $1
The end-to-end tests build kube-apiserver and etcd from source and need
Go >= 1.$MIN_GO_MINOR (Go 1.26 or newer avoids an automatic toolchain download,
because etcd $ETCD_VERSION declares go 1.26). Install it from
https://go.dev/dl/, for example on linux/amd64:
    curl -fsSL https://go.dev/dl/go1.26.0.linux-amd64.tar.gz | sudo tar -C /usr/local -xz
    export PATH=\$PATH:/usr/local/go/bin
or point the GO environment variable at an existing go binary.
EOF
    exit 2
}

find_go() {
    if [[ -n ${GO:-} ]]; then
        command -v "$GO" || die_no_go "GO=$GO is not an executable."
    elif command -v go >/dev/null; then
        command -v go
    elif [[ -x /usr/local/go/bin/go ]]; then
        # The official tarball installs here, and it is often not on PATH
        # in non-login shells such as CI steps.
        echo /usr/local/go/bin/go
    else
        die_no_go "the go command was not found."
    fi
}

check_go_version() {
    local go_bin=$1 version minor
    version=$("$go_bin" env GOVERSION) || die_no_go "'$go_bin env GOVERSION' failed."
    minor=$(sed -nE 's/^go1\.([0-9]+).*/\1/p' <<<"$version")
    if [[ -z $minor || $minor -lt $MIN_GO_MINOR ]]; then
        die_no_go "found $version at $go_bin, which is too old."
    fi
}

# Fails fast when the variables above and the go.mod pins disagree, since the
# cache directory (and so the reuse of built binaries) is keyed on the former.
check_pins() {
    if ! grep -qE "^\s*k8s.io/kubernetes $KUBE_VERSION( |$)" "$HERE/apiserver/go.mod" ||
        ! grep -qE "^\s*go.etcd.io/etcd/server/v3 $ETCD_VERSION( |$)" "$HERE/etcd/go.mod"; then
        log "KUBE_VERSION/ETCD_VERSION do not match apiserver/go.mod and etcd/go.mod"
        exit 1
    fi
}

# The Kubernetes binaries, all from the one k8s.io/kubernetes module. The kubelet runs the
# suite's real node (tests/e2e/kubelet.py); kubectl runs the docs' commands as an admin
# types them (tests/e2e/test_first_install.py, test_upgrade.py).
KUBE_BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl)

# The version a built binary reports: kubectl says it its own way.
kube_version_of() {
    if [[ $1 == kubectl ]]; then
        "$BIN_DIR/kubectl" version --client 2>/dev/null | sed -n 's/^Client Version: //p'
    else
        "$BIN_DIR/$1" --version 2>/dev/null | sed -n 's/^Kubernetes //p'
    fi
}

# Succeeds only when the binary runs and reports the pinned version, so a stale or
# truncated binary is rebuilt.
kube_ready() {
    [[ -x $BIN_DIR/$1 ]] || return 1
    [[ $(kube_version_of "$1") == "$KUBE_VERSION" ]]
}

etcd_ready() {
    [[ -x $BIN_DIR/etcd ]] || return 1
    # Captured first: piping into "grep -q" would let etcd die of SIGPIPE,
    # which pipefail turns into a spurious "not ready".
    local etcd_version
    etcd_version=$("$BIN_DIR/etcd" --version 2>/dev/null) || return 1
    grep -qx "etcd Version: ${ETCD_VERSION#v}" <<<"$etcd_version"
}

binaries_ready() {
    local kube
    for kube in "${KUBE_BINARIES[@]}"; do
        kube_ready "$kube" || return 1
    done
    etcd_ready
}

kube_ldflags() {
    local minor=${KUBE_VERSION#v1.}
    minor=${minor%%.*}
    local flags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean"
    done
    echo "$flags"
}

# Builds one binary to a temporary name in the target directory and renames
# it into place, so an interrupted build never leaves a partial binary.
build_one() {
    local go_bin=$1 module_dir=$2 package=$3 name=$4 ldflags=$5
    local tmp=$BIN_DIR/.$name.partial.$$
    log "building $name from $package (module $module_dir)"
    (cd "$HERE/$module_dir" &&
        CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$tmp" "$package") >&2
    mv -f "$tmp" "$BIN_DIR/$name"
}

main() {
    check_pins
    mkdir -p "$BIN_DIR"
    # Serialise concurrent runs (parallel CI jobs, two test sessions) so they
    # do not compile the same binaries twice.
    if command -v flock >/dev/null; then
        exec 9>"$OUT_DIR/.lock"
        flock 9
    fi
    if binaries_ready; then
        log "up to date: ${KUBE_BINARIES[*]} $KUBE_VERSION, etcd $ETCD_VERSION"
        echo "$BIN_DIR"
        return
    fi
    local go_bin
    go_bin=$(find_go)
    check_go_version "$go_bin"
    # Leftovers of builds that were killed outright; the lock means no other
    # build is writing them now.
    rm -f "$BIN_DIR"/.*.partial.*
    trap 'rm -f "$BIN_DIR"/.*.partial.$$' EXIT
    # Only what is missing or stale is built, so a cache from before the kubelet joined the
    # list gains just the kubelet. The scheduler, controller manager and kubelet share most
    # of their packages with the apiserver: with the Go cache warm each costs a minute or two.
    # Of the controller manager the suite runs few controllers; see tests/e2e/cluster.py.
    local kube
    for kube in "${KUBE_BINARIES[@]}"; do
        kube_ready "$kube" ||
            build_one "$go_bin" apiserver "k8s.io/kubernetes/cmd/$kube" "$kube" "$(kube_ldflags)"
    done
    etcd_ready || build_one "$go_bin" etcd go.etcd.io/etcd/server/v3 etcd "-s -w"
    binaries_ready || { log "built binaries do not report the expected versions"; exit 1; }
    log "built ${KUBE_BINARIES[*]} $KUBE_VERSION, etcd $ETCD_VERSION in $BIN_DIR"
    echo "$BIN_DIR"
}

main "$@"
