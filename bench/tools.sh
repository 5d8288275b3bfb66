#!/usr/bin/env bash
# Builds vegeta, the HTTP load generator `make bench` drives, from its Go module. The benchmark
# needs a compiled generator: a Python one saturates its own CPU before a fast server does, and
# then measures itself. vegeta goes into its own versioned directory under
# ${GPUADM_CACHE:-$HOME/.cache/gpuadm}/tools, as deploy/tools/install.sh does for kustomize and
# helm; a build already there is reused.
#
# Everything Go prints goes to stderr. The last line on stdout is vegeta's bin directory:
#
#   VEGETA="$(bash bench/tools.sh | tail -n 1)/vegeta"
set -euo pipefail

# `go list -m -versions github.com/tsenart/vegeta/v12` lists the releases. v12.13.0 declares
# `go 1.22` in its go.mod.
VEGETA_VERSION=v12.13.0
MIN_GO=1.22

dir="${GPUADM_CACHE:-$HOME/.cache/gpuadm}/tools/vegeta-$VEGETA_VERSION"

if [[ -x "$dir/bin/vegeta" ]]; then
    echo "vegeta $VEGETA_VERSION: already in $dir" >&2
    echo "$dir/bin"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    cat >&2 <<EOF
bench/tools.sh: Go is not installed (no 'go' on PATH).
vegeta $VEGETA_VERSION, the benchmark's load generator, is built from source with 'go install'.
Install Go $MIN_GO or newer (https://go.dev/dl/, or your package manager) and run this again.
EOF
    exit 1
fi

mkdir -p "$(dirname "$dir")"
# Build into a scratch directory and rename it into place, so an interrupted build never leaves
# a directory that the check above would take for a finished one.
scratch=$(mktemp -d "$(dirname "$dir")/.vegeta-$VEGETA_VERSION.XXXXXX")
echo "vegeta $VEGETA_VERSION: building github.com/tsenart/vegeta/v12 (about a minute)" >&2
# Its release builds stamp the version in with -X; without it `vegeta -version` prints nothing.
if ! CGO_ENABLED=0 GOBIN="$scratch/bin" go install -trimpath \
    -ldflags "-X main.Version=$VEGETA_VERSION" \
    "github.com/tsenart/vegeta/v12@$VEGETA_VERSION" >&2; then
    rm -rf "$scratch"
    echo "bench/tools.sh: building vegeta $VEGETA_VERSION failed (see above);" \
        "it needs Go $MIN_GO or newer and this is $(go env GOVERSION)" >&2
    exit 1
fi
rm -rf "$dir"
mv "$scratch" "$dir"
echo "$dir/bin"
