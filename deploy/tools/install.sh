#!/usr/bin/env bash
# Builds kustomize and helm from their Go modules, so the manifest tests can render deploy/
# on a machine with no Docker and no release downloads, and promtool, with which they check
# and unit-test gpuadm's alerts. Each tool goes into its own versioned directory under
# ${GPUADM_CACHE:-$HOME/.cache/gpuadm}/tools; a tool already there is reused.
#
# Everything Go prints goes to stderr. The last line on stdout is the tools' bin directories
# joined with ':', ready to put in front of PATH:
#
#   PATH="$(bash deploy/tools/install.sh | tail -n 1):$PATH"
set -euo pipefail

# `go list -m -versions <module>` lists the releases. Both of these declare `go 1.26.0` in their
# go.mod (kustomize v5.8.3 already wants Go 1.27), so bumping one may raise the Go it needs.
KUSTOMIZE_VERSION=v5.8.2
HELM_VERSION=v3.22.0
MIN_GO=1.26
# Prometheus' Go module numbers release 3.16.0 as v0.316.0; promtool is its cmd/promtool. This
# release declares `go 1.26.7`: Go 1.26.0 to 1.26.6 fetch that toolchain from the module proxy
# by themselves, unless GOTOOLCHAIN=local. v0.313.x to v0.315.0 carry replace directives, and
# v0.309.1 exclude directives, which `go install module@version` refuses.
PROMETHEUS_VERSION=v0.316.0
PROMETHEUS_RELEASE=3.16.0
PROMTOOL_MIN_GO=1.26.7

tools_dir="${GPUADM_CACHE:-$HOME/.cache/gpuadm}/tools"

if ! command -v go >/dev/null 2>&1; then
    cat >&2 <<EOF
deploy/tools/install.sh: Go is not installed (no 'go' on PATH).
kustomize $KUSTOMIZE_VERSION, helm $HELM_VERSION and promtool $PROMETHEUS_VERSION are built from source
with 'go install'.
Install Go $MIN_GO or newer (https://go.dev/dl/, or your package manager) and run this again.
promtool needs Go $PROMTOOL_MIN_GO, which an older Go 1.26 fetches itself unless GOTOOLCHAIN=local.
EOF
    exit 1
fi

# install_tool NAME VERSION PACKAGE [GO-INSTALL-FLAGS...]
# NEEDS_GO overrides MIN_GO in the error message, for a tool that needs a newer Go.
install_tool() {
    local name=$1 version=$2 package=$3 needs_go=${NEEDS_GO:-$MIN_GO}
    shift 3
    local dir="$tools_dir/$name-$version"
    if [[ -x "$dir/bin/$name" ]]; then
        echo "$name $version: already in $dir" >&2
        return
    fi
    mkdir -p "$tools_dir"
    # Build into a scratch directory and rename it into place, so an interrupted build never
    # leaves a directory that the check above would take for a finished one.
    local scratch
    scratch=$(mktemp -d "$tools_dir/.$name-$version.XXXXXX")
    echo "$name $version: building $package (a few minutes on a small machine)" >&2
    if ! CGO_ENABLED=0 GOBIN="$scratch/bin" go install -trimpath "$@" "$package@$version" >&2; then
        rm -rf "$scratch"
        echo "deploy/tools/install.sh: building $name $version failed (see above);" \
            "it needs Go $needs_go or newer and this is $(go env GOVERSION)" >&2
        exit 1
    fi
    rm -rf "$dir"
    mv "$scratch" "$dir"
}

install_tool kustomize "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5
# Helm's release builds stamp two things in with -X, as its Makefile does. Its version, else
# `helm version` says "unreleased". And the Kubernetes version of the client-go it is built
# with (v0.37 for helm v3.22.0), which `helm template` takes as the cluster's version: without
# it helm claims 1.20, and the chart's kubeVersion (>= 1.30, for matchConditions) refuses it.
helm_kube_minor=37
install_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm -ldflags "\
-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm_kube_minor \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$helm_kube_minor"

# promtool: -tags remove_all_sd leaves out the service discoveries of cloud providers and
# others, which the rule commands never use. Without it the build fails: the nomad discovery
# pins a version of github.com/hashicorp/nomad/api that the module proxy does not serve. The
# version is stamped in as Prometheus' own build does, else `promtool --version` prints none.
NEEDS_GO=$PROMTOOL_MIN_GO install_tool promtool "$PROMETHEUS_VERSION" \
    github.com/prometheus/prometheus/cmd/promtool -tags remove_all_sd \
    -ldflags "-X github.com/prometheus/common/version.Version=$PROMETHEUS_RELEASE"

echo "$tools_dir/kustomize-$KUSTOMIZE_VERSION/bin:$tools_dir/helm-$HELM_VERSION/bin:\
$tools_dir/promtool-$PROMETHEUS_VERSION/bin"
