#!/usr/bin/env bash
# Builds the gpuadm image from the repository's Dockerfile with no Docker engine and no image
# registry: the base is made here from Debian bookworm's own packages (python3, python3-venv,
# ca-certificates, passwd) with mmdebstrap, and the Dockerfile is built on it by buildah with
# --build-arg BASE=<that base>. Only Debian's mirror (the one the host's apt sources name) and
# PyPI are reached. The result is an OCI archive, which `ctr images import` and `podman load`
# take as it is.
#
# Cached under $GPUADM_CACHE/image/ and keyed on everything the image is made from: the
# Dockerfile and .dockerignore, pyproject.toml, README.md, policies/, webhook/ and certs/, this
# script, the base's package list and the git revision of those files. Safe to run repeatedly:
# when the archive for the current key is present, nothing is built. The base is kept on its
# own, keyed on its recipe and mirrors; remove $GPUADM_CACHE/image to take Debian's updates.
# The six images (the upgrade test needs two at once: a release's and the current tree's) and
# two bases used last are kept.
#
# With an argument, the image is built from that directory instead of this repository: a tree
# of an earlier release exported with `git archive <commit> | tar -x -C DIR`, whose own
# Dockerfile and sources make the image (its Dockerfile must take the BASE build-arg). It is
# cached as the current tree's image is, keyed on that directory's sources and this script;
# its revision is the directory's git commit when it is a checkout of its own, else
# $GPUADM_REVISION, else "unknown".
#
# Progress goes to stderr. Stdout is two lines, the archive's path and the image's name
# (gpuadm.local/gpuadm:<version>-<key>, the name it is imported under), so callers can use
#     { read -r archive; read -r image; } < <(image/build.sh)
#
# Runs as root: mmdebstrap's root mode and buildah's chroot isolation. Every build uses its own
# buildah storage, removed afterwards, so nothing outside the cache is left behind.
#
# Usage: image/build.sh [SOURCE_DIR]
#
# Environment:
#   GPUADM_CACHE     cache root (default: $HOME/.cache/gpuadm)
#   GPUADM_REVISION  the revision label of a SOURCE_DIR that is no git checkout
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF=$HERE/$(basename "${BASH_SOURCE[0]}")
if [[ $# -gt 1 ]]; then
    printf 'usage: %s [SOURCE_DIR]\n' "$0" >&2
    exit 2
fi
if [[ $# -eq 1 ]]; then
    [[ -f $1/Dockerfile ]] || {
        printf 'image/build.sh: %s has no Dockerfile\n' "$1" >&2
        exit 2
    }
    REPO=$(cd "$1" && pwd)
else
    REPO=$(cd "$HERE/.." && pwd)
fi
CACHE_ROOT=${GPUADM_CACHE:-$HOME/.cache/gpuadm}
IMAGE_ROOT=$CACHE_ROOT/image
IMAGE_REPO=gpuadm.local/gpuadm
ARCHIVE=gpuadm.oci.tar

# The base: Debian's Python 3.11 and its venv module, the CA bundle, and groupadd/useradd for
# the Dockerfile's user. Debian's /usr merge is set up as debootstrap does (the merged-usr
# hook), which keeps the usrmerge package and the Perl it needs out of the image; no
# recommends, manuals, docs or translations (copyright files stay).
BASE_SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates,passwd
BASE_OPTIONS=(
    --variant=minbase
    --include="$BASE_PACKAGES"
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --aptopt='APT::Install-Recommends "false"'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --skip=output/dev
)
BASE_REPO=gpuadm.local/debian-python3

# What `pip install .` reads, as .dockerignore admits it into the build context. image/build.sh
# is always this script, whichever tree the image is built from.
SOURCE_FILES=(Dockerfile .dockerignore pyproject.toml README.md image/build.sh)
SOURCE_TREES=(policies webhook certs)

log() { printf 'image/build.sh: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 2
}

check_tools() {
    local tool
    for tool in mmdebstrap buildah flock sha256sum; do
        command -v "$tool" >/dev/null ||
            die "$tool is not installed (on Debian: apt-get install mmdebstrap buildah)"
    done
    [[ $EUID -eq 0 ]] || die "run as root: mmdebstrap and buildah build the image as root here"
}

# The host's Debian mirrors for the base's suite, its updates and its security suite, as
# sources.list lines; deb.debian.org where the host names none (another release or distro).
debian_sources() {
    local lines=""
    if command -v apt-get >/dev/null; then
        # $(SITE) and $(RELEASE) are apt's placeholders, not the shell's.
        # shellcheck disable=SC2016
        lines=$(apt-get indextargets --format '$(SITE) $(RELEASE)' 'Created-By: Packages' \
            'Target-Of: deb' 2>/dev/null |
            awk -v s="$BASE_SUITE" '$2 == s || $2 == s "-updates" || $2 == s "-security" {
                print "deb " $1 " " $2 " main" }' | sort -u)
    fi
    if [[ -z $lines ]]; then
        lines="deb http://deb.debian.org/debian $BASE_SUITE main
deb http://deb.debian.org/debian $BASE_SUITE-updates main
deb http://deb.debian.org/debian-security $BASE_SUITE-security main"
    fi
    printf '%s\n' "$lines"
}

# The CA bundle pip trusts on this host (PIP_CERT, else the system's), bound over the base's
# bundle while the Dockerfile's RUN steps run, so PyPI is reached as the host reaches it (a
# proxy that re-signs TLS included). Debian's pip reads the system bundle; the image keeps its
# own, since a bind mount is not part of any layer.
host_ca_bundle() {
    local bundle=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
    [[ -f $bundle ]] && echo "$bundle"
    return 0
}

sha() { sha256sum | cut -c1-16; }

# The buildah command on a storage of its own under $1, with the overlay driver.
buildah_in() {
    local dir=$1
    shift
    buildah --root "$dir/storage" --runroot "$dir/run" --storage-driver overlay "$@"
}

# Removes a build directory, unmounting first whatever a killed build left mounted in it; a
# mount that would not come off is left standing, never walked into (--one-file-system).
scrub() {
    local dir=$1 mount
    [[ -e $dir ]] || return 0
    while read -r mount; do
        umount -l "$mount" 2>/dev/null || true
    done < <(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    rm -rf --one-file-system "$dir"
}

# The base, made once per recipe and mirror into base-<key>/: its OCI archive and its package
# list (name and version, one a line), which is part of the image's key.
build_base() {
    local dir=$1 name=$2 sources=$3
    local tmp=$dir.partial.$$
    mkdir -p "$tmp"
    log "making the base $name with mmdebstrap ($BASE_SUITE: $BASE_PACKAGES)"
    local -a mirrors
    mapfile -t mirrors <<<"$sources"
    mmdebstrap --quiet "${BASE_OPTIONS[@]}" "$BASE_SUITE" "$tmp/rootfs.tar" "${mirrors[@]}" >&2
    mkdir "$tmp/dpkg"
    tar -xOf "$tmp/rootfs.tar" ./var/lib/dpkg/status >"$tmp/dpkg/status"
    dpkg-query --admindir="$tmp/dpkg" -W -f='${Package} ${Version}\n' | sort >"$tmp/packages.txt"
    local ctr
    ctr=$(buildah_in "$tmp" from scratch)
    buildah_in "$tmp" add "$ctr" "$tmp/rootfs.tar" / >/dev/null
    buildah_in "$tmp" config \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 \
        --label org.opencontainers.image.title="Debian $BASE_SUITE with python3" "$ctr"
    buildah_in "$tmp" commit --quiet --rm "$ctr" "oci-archive:$tmp/base.oci.tar:$name" >/dev/null
    buildah_in "$tmp" rmi --all --force >/dev/null
    rm -rf --one-file-system "$tmp/rootfs.tar" "$tmp/dpkg" "$tmp/storage" "$tmp/run"
    mv "$tmp" "$dir"
}

# The hash of every input of the image; the base's package list and the revision come in as
# arguments, so a Debian update or a new commit of the sources is a new key.
image_key() {
    local packages=$1 revision=$2
    {
        local file
        for file in "${SOURCE_FILES[@]}"; do
            if [[ $file == image/build.sh ]]; then
                sha256sum <"$SELF" | sed 's|-$|image/build.sh|'
            else
                (cd "$REPO" && sha256sum "$file")
            fi
        done
        (cd "$REPO" && find "${SOURCE_TREES[@]}" -type f ! -path '*/__pycache__/*' \
            ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
        sha256sum <"$packages"
        echo "revision $revision"
    } | sha
}

# The last commit of the image's inputs, "-dirty" when the work tree changes them; outside a
# git checkout of its own (an exported tree, even one inside another checkout),
# $GPUADM_REVISION or "unknown".
source_revision() {
    local paths=("${SOURCE_FILES[@]}" "${SOURCE_TREES[@]}") commit="" top
    top=$(git -C "$REPO" rev-parse --show-toplevel 2>/dev/null) || top=""
    if [[ -n $top && $(cd "$top" && pwd -P) == $(cd "$REPO" && pwd -P) ]]; then
        commit=$(git -C "$REPO" log -1 --format=%H -- "${paths[@]}" 2>/dev/null) || commit=""
    else
        echo "${GPUADM_REVISION:-unknown}"
        return 0
    fi
    if [[ -z $commit ]]; then
        echo unknown
    elif [[ -n $(git -C "$REPO" status --porcelain -- "${paths[@]}" 2>/dev/null) ]]; then
        echo "$commit-dirty"
    else
        echo "$commit"
    fi
}

# Keeps the `keep` directories named like `pattern` used last (a hit counts as a use) and
# removes the rest: an image is some 80 MB and every commit of the sources is a new key.
prune() {
    local pattern=$1 keep=$2 dir
    find "$IMAGE_ROOT" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
        -regex ".*/$pattern" -printf '%T@ %p\n' | sort -rn | tail -n +"$((keep + 1))" |
        cut -d' ' -f2- | while read -r dir; do
        log "removing the unused $dir"
        rm -rf --one-file-system "$dir"
    done
}

project_version() {
    sed -nE 's/^version = "([^"]+)"$/\1/p' "$REPO/pyproject.toml" | head -n 1
}

# Builds the Dockerfile on the base into <key>/, through a temporary directory renamed into
# place, so an interrupted build never leaves an archive behind.
build_image() {
    local dir=$1 name=$2 base_archive=$3 base_name=$4 version=$5 revision=$6
    local tmp=$dir.partial.$$
    mkdir -p "$tmp"
    local base_id
    base_id=$(buildah_in "$tmp" pull --quiet "oci-archive:$base_archive")
    buildah_in "$tmp" tag "$base_id" "$base_name"
    local -a mounts=()
    local bundle
    bundle=$(host_ca_bundle)
    [[ -n $bundle ]] && mounts=(--volume "$bundle:/etc/ssl/certs/ca-certificates.crt:ro")
    log "building $name on $base_name"
    # chroot isolation with the host's network: no runtime or CNI setup, and pip reaches PyPI.
    buildah_in "$tmp" build --isolation chroot --network host --pull=never \
        --build-arg BASE="$base_name" --build-arg VERSION="$version" \
        --build-arg REVISION="$revision" "${mounts[@]}" \
        --file "$REPO/Dockerfile" --tag "$name" "$REPO" >&2
    buildah_in "$tmp" push --quiet "$name" "oci-archive:$tmp/$ARCHIVE:$name" >&2
    buildah_in "$tmp" rmi --all --force >/dev/null
    rm -rf --one-file-system "$tmp/storage" "$tmp/run"
    echo "$name" >"$tmp/name"
    mv "$tmp" "$dir"
}

# Removes this run's unfinished build directories, on any exit.
clean_up() {
    local dir
    for dir in "$IMAGE_ROOT"/*".partial.$$"; do
        scrub "$dir"
    done
}

main() {
    check_tools
    mkdir -p "$IMAGE_ROOT"
    # Serialise concurrent runs (two test sessions, the e2e suite and `make image`) so they do
    # not build the same image twice.
    exec 9>"$IMAGE_ROOT/.lock"
    flock 9
    # Leftovers of builds that were killed outright; the lock means no build is writing them.
    local leftover
    for leftover in "$IMAGE_ROOT"/*.partial.*; do
        scrub "$leftover"
    done
    trap clean_up EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    local sources base_key base_dir base_name
    sources=$(debian_sources)
    # The recipe is the options and the function that applies them.
    base_key=$({
        printf '%s\n' "$BASE_SUITE" "${BASE_OPTIONS[@]}"
        declare -f build_base
        echo "$sources"
    } | sha)
    base_dir=$IMAGE_ROOT/base-$base_key
    base_name=$BASE_REPO:$BASE_SUITE-$base_key
    if [[ -f $base_dir/base.oci.tar ]]; then
        touch "$base_dir"
    else
        scrub "$base_dir"
        build_base "$base_dir" "$base_name" "$sources"
    fi

    local version revision key dir name
    version=$(project_version)
    [[ -n $version ]] || die "no version in pyproject.toml"
    revision=$(source_revision)
    key=$(image_key "$base_dir/packages.txt" "$revision")
    dir=$IMAGE_ROOT/$key
    name=$IMAGE_REPO:$version-$key
    if [[ -f $dir/$ARCHIVE ]]; then
        touch "$dir"
        log "up to date: $name"
    else
        scrub "$dir"
        build_image "$dir" "$name" "$base_dir/base.oci.tar" "$base_name" "$version" "$revision"
        log "built $name"
    fi
    prune '[0-9a-f]{16}' 6
    prune 'base-[0-9a-f]{16}' 2
    echo "$dir/$ARCHIVE"
    echo "$name"
}

main "$@"
