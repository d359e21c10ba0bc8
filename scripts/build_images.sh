#!/usr/bin/env bash
# Builds the container images without a Docker engine: buildah (vfs storage,
# chroot isolation) on a local Debian base made with debootstrap.
#
#   bash scripts/build_images.sh              # every image below
#   bash scripts/build_images.sh operator     # only the images named
#
# 1. The base: `debootstrap --variant=minbase` of Debian bookworm (python3,
#    python3-venv) from the Debian mirror apt uses, plus a venv at /opt/venv on
#    PATH, so `python -m pip` works as in the public python images. The root
#    filesystem is cached as a tarball under $PAGEDINFER_CACHE_DIR
#    (~/.cache/pagedinfer) keyed by its inputs, and the base image stays in
#    the store under a tag carrying its own key.
# 2. Each image: `buildah bud` of its Dockerfile in images/ (the same files
#    `docker build` takes), with --build-arg BASE_IMAGE=<the local base> (and
#    COMPILER_IMAGE=<the base plus its Debian packages> where it has some). Its
#    Python packages are exactly its lock, requirements/<image>.lock: pip
#    downloads the lock's files here (--no-deps --require-hashes: nothing is
#    resolved, every file's sha256 is the lock's), from wherever this machine's
#    pip is configured to look (pip config list), into a wheelhouse that the
#    build sees at /mnt with `no-index` (a pip.conf at /etc/xdg/pip): the build
#    downloads nothing itself. Both mount points are empty in the base, so the
#    images keep no trace of them. The lock is resolved for CPython 3.11, the
#    base's (Debian bookworm's python3); the script stops on any other.
# 3. Out, in $PAGEDINFER_IMAGES_DIR (build/images): <image>.oci.tar, an OCI
#    archive named with the chart's tag (`kind load image-archive`, `ctr images
#    import`), and <image>.json: its tag, id, size, build seconds and the
#    buildah storage flags, which tests/images read.
#
# Without buildah or debootstrap, or without root, this is a skip (exit 0,
# saying why); with CI=true it installs them with apt-get, or fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
SELF="$ROOT/scripts/build_images.sh"

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
# image name | Dockerfile | tag (what the chart and the CRD expect) | the lock it installs |
# Debian packages its build stage installs (the CPU engine's `kernels` stage: g++), kept in a cached layer over
# the base, which the build gets as COMPILER_IMAGE (its RUN then finds them); the final stage is the bare base
IMAGES=(
    "operator|images/operator.Dockerfile|ghcr.io/pagedinfer/pagedinfer-operator:${VERSION}|requirements/operator.lock|"
    "engine-cpu|images/engine-cpu.Dockerfile|ghcr.io/pagedinfer/pagedinfer:${VERSION}-cpu|requirements/engine-cpu.lock|g++"
    "router|images/router.Dockerfile|ghcr.io/pagedinfer/pagedinfer-router:${VERSION}|requirements/router.lock|"
)
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv
OUT="${PAGEDINFER_IMAGES_DIR:-$ROOT/build/images}"
CACHE="${PAGEDINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pagedinfer}"
# A store of our own: vfs needs no overlay support, and a user's podman store
# (perhaps overlay) is left alone.
BUILDAH=(buildah --root "$CACHE/containers/storage" --runroot "${XDG_RUNTIME_DIR:-/run}/pagedinfer-containers"
         --storage-driver vfs)
# The Python whose pip downloads the images' locks: the project's venv (scripts/setup.sh).
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

PYTHON_VERSION='import sys; print("%d.%d" % sys.version_info[:2])'

log() { printf '[build_images] %s\n' "$*" >&2; }
now() { date +%s.%N; }
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

skip_or_fail() {
    if [ "${CI:-}" != "true" ]; then
        log "SKIPPED: $*; no image built"
        exit 0
    fi
    log "FAILED: $* (CI=true: the images must be built)"
    exit 1
}

ensure_tools() {
    [ "$(id -u)" -eq 0 ] || skip_or_fail "needs root (buildah's chroot isolation and its vfs store)"
    local missing=()
    for tool in buildah debootstrap; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "${CI:-}" = "true" ] || skip_or_fail "${missing[*]} not installed (Debian: apt-get install buildah debootstrap)"
    log "CI: installing ${missing[*]}"
    local start; start="$(now)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null; }
    log "installed buildah and debootstrap in $(since "$start") s"
}

debian_mirror() {
    # The mirror apt is configured with (deb822 or one-line sources), else Debian's.
    local uri
    uri="$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v security | head -1)"
    [ -n "$uri" ] || uri="$(awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null)"
    echo "${PAGEDINFER_DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

rootfs_tarball() {
    # Prints the path of the debootstrapped root filesystem's tarball, made if
    # not cached (keyed by the suite, packages, architecture and this recipe).
    local key tarball rootfs="$WORK/rootfs" mirror start
    key="$(printf '%s\n' "$SUITE" minbase "$BASE_PACKAGES" "$(dpkg --print-architecture)" \
        "$(sed -n '/^rootfs_tarball()/,/^}/p' "$SELF")" | sha256sum | cut -c1-16)"
    tarball="$CACHE/rootfs/debian-${SUITE}-minbase-${key}.tar"
    if [ -f "$tarball" ]; then
        echo "$tarball"; return
    fi
    mirror="$(debian_mirror)"
    start="$(now)"
    log "debootstrap $SUITE from $mirror (cached afterwards as $tarball)"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
    # No apt cache or lists, and none of this machine's network identity
    # (debootstrap copies its resolv.conf and hostname); the runtime mounts
    # its own /etc/hosts and /etc/resolv.conf onto these files.
    rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/etc/hostname
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$rootfs/etc/hosts"
    : >"$rootfs/etc/resolv.conf"
    # /etc/xdg/pip: where builds mount their pip.conf (an empty directory).
    mkdir -p "$rootfs/etc/xdg/pip" "$(dirname "$tarball")"
    tar --numeric-owner -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"
    find "$(dirname "$tarball")" -name "debian-*.tar" ! -path "$tarball" -delete  # other recipes' tarballs
    log "debootstrap: $(since "$start") s, $(du -h "$tarball" | cut -f1) tarball"
    echo "$tarball"
}

base_image() {
    # Prints the local base image's name, built from the root filesystem if
    # not in the store: the tarball plus a venv at /opt/venv on PATH.
    local tarball key name start ctr python
    tarball="$(rootfs_tarball)"
    key="$(printf '%s\n' "$(basename "$tarball")" "$(sed -n '/^base_image()/,/^}/p' "$SELF")" | sha256sum | cut -c1-16)"
    name="localhost/pagedinfer-base:${SUITE}-${key}"
    if "${BUILDAH[@]}" inspect --type image "$name" >/dev/null 2>&1; then
        log "base $name: cached"
        echo "$name"; return
    fi
    start="$(now)"
    ctr="$("${BUILDAH[@]}" from scratch)"
    "${BUILDAH[@]}" add "$ctr" "$tarball" / >/dev/null
    "${BUILDAH[@]}" run --isolation chroot --network host "$ctr" -- python3 -m venv /opt/venv
    python="$("${BUILDAH[@]}" run --isolation chroot --network host "$ctr" -- python3 -c "$PYTHON_VERSION")"
    "${BUILDAH[@]}" config --env PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd python3 --label "dev.pagedinfer.python=$python" "$ctr"
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$name" >/dev/null
    # Bases of other recipes (a layer stays while an image still uses it).
    "${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/pagedinfer-base:' | grep -vxF "$name" \
        | xargs -r "${BUILDAH[@]}" rmi --force >/dev/null 2>&1 || true
    log "base $name: $(since "$start") s"
    echo "$name"
}

apt_layer() {
    # Prints the image to build from: the base itself, or the base plus the Debian packages $2
    # (apt-get, no recommends, no lists kept), cached in the store under a tag keyed by both and
    # this recipe, so a rebuild installs no compiler again.
    local base="$1" packages="$2" key name ctr start
    if [ -z "$packages" ]; then
        echo "$base"; return
    fi
    key="$(printf '%s\n' "$base" "$packages" "$(sed -n '/^apt_layer()/,/^}/p' "$SELF")" | sha256sum | cut -c1-16)"
    name="localhost/pagedinfer-apt:${key}"
    if "${BUILDAH[@]}" inspect --type image "$name" >/dev/null 2>&1; then
        log "apt layer $name ($packages): cached"
        echo "$name"; return
    fi
    start="$(now)"
    ctr="$("${BUILDAH[@]}" from "$base")"
    # shellcheck disable=SC2086  # the packages are a word list
    "${BUILDAH[@]}" run --isolation chroot --network host "$ctr" -- sh -c \
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null && rm -rf /var/lib/apt/lists/*"
    "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$name" >/dev/null
    log "apt layer $name ($packages): $(since "$start") s"
    echo "$name"
}

check_python() {
    # The wheelhouse is downloaded here for the base's Python (the locks' 3.11): their versions must match.
    local ours theirs
    ours="$("$PYTHON" -c "$PYTHON_VERSION")"
    theirs="$("${BUILDAH[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "dev.pagedinfer.python"}}' "$1")"
    if [ "$ours" != "$theirs" ]; then
        log "$PYTHON is Python $ours, the base image's is $theirs: set PYTHON to a Python $theirs"
        exit 1
    fi
}

wheelhouse() {
    # Downloads every file the lock $2 names into $1, with this machine's pip config (and
    # PAGEDINFER_TORCH_INDEX_URL for torch's CPU build): the lock's versions only, each checked against
    # its sha256. Its build requirements (pip, setuptools, wheel, and packaging for wheel) are in it too.
    local dir="$1" lock="$2" torch_index=()
    [ -n "${PAGEDINFER_TORCH_INDEX_URL:-}" ] && torch_index=(--extra-index-url "$PAGEDINFER_TORCH_INDEX_URL")
    mkdir -p "$dir"
    # From /: the repository root on sys.path would shadow the stdlib's operator.
    (cd / && "$PYTHON" -m pip download -qq --disable-pip-version-check --only-binary=:all: --no-deps \
        --require-hashes "${torch_index[@]}" --dest "$dir" -r "$ROOT/$lock")
}

build_image() {
    local name="$1" dockerfile="$2" tag="$3" lock="$4" base="$5" from="$6" start archive
    start="$(now)"
    wheelhouse "$WORK/wheels/$name" "$lock"
    local wheels_s; wheels_s="$(since "$start")"
    mkdir -p "$WORK/pip-$name"
    local compiler=()
    [ "$from" = "$base" ] || compiler=(--build-arg "COMPILER_IMAGE=$from")
    printf '[global]\nno-index = true\nfind-links = /mnt\n' >"$WORK/pip-$name/pip.conf"
    start="$(now)"
    "${BUILDAH[@]}" bud --quiet --isolation chroot --network host --layers=false \
        --build-arg "BASE_IMAGE=$base" "${compiler[@]}" \
        --volume "$WORK/wheels/$name:/mnt:ro" --volume "$WORK/pip-$name:/etc/xdg/pip:ro" \
        --label "dev.pagedinfer.source=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
        -f "$dockerfile" -t "$tag" "$ROOT" >/dev/null
    local build_s; build_s="$(since "$start")"
    start="$(now)"
    archive="$OUT/$name.oci.tar"
    rm -f "$archive"
    "${BUILDAH[@]}" push --quiet "$tag" "oci-archive:$archive:$tag"
    local archive_s; archive_s="$(since "$start")"
    local id size_bytes archive_bytes
    id="$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$tag")"
    # The unpacked size: the sum of its (uncompressed) layers.
    size_bytes="$("${BUILDAH[@]}" inspect --type image --format '{{.Manifest}}' "$tag" \
        | "$PYTHON" -c 'import json, sys; print(sum(layer["size"] for layer in json.load(sys.stdin)["layers"]))')"
    archive_bytes="$(stat -c %s "$archive")"
    log "$name: $tag, image $(mib "$size_bytes") MiB, archive $(mib "$archive_bytes") MiB;" \
        "wheels ${wheels_s} s, build ${build_s} s, archive ${archive_s} s"
    local storage
    storage="$(printf '"%s", ' "${BUILDAH[@]:1}")"
    printf '{"name": "%s", "tag": "%s", "dockerfile": "%s", "base": "%s", "from_image": "%s", "id": "%s", "size_bytes": %s, "archive": "%s", "archive_bytes": %s, "seconds": {"wheels": %s, "build": %s, "archive": %s}, "buildah": [%s]}\n' \
        "$name" "$tag" "$dockerfile" "$base" "$from" "$id" "$size_bytes" "$archive" "$archive_bytes" "$wheels_s" "$build_s" "$archive_s" \
        "${storage%, }" >"$OUT/$name.json"
}

main() {
    local selected=("$@") start base known=" "
    for spec in "${IMAGES[@]}"; do
        known+="${spec%%|*} "
    done
    for name in "${selected[@]}"; do
        if [[ "$known" != *" $name "* ]]; then
            echo "build_images.sh: unknown image '$name' (images:${known% })" >&2
            exit 2
        fi
    done
    ensure_tools
    start="$(now)"
    mkdir -p "$OUT" "$CACHE"
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    base="$(base_image)"
    check_python "$base"
    local layer used_layers=""
    for spec in "${IMAGES[@]}"; do
        IFS='|' read -r name dockerfile tag lock packages <<<"$spec"
        if [ ${#selected[@]} -gt 0 ] && [[ " ${selected[*]} " != *" $name "* ]]; then
            continue
        fi
        layer="$(apt_layer "$base" "$packages")"
        used_layers+="$layer"$'\n'
        build_image "$name" "$dockerfile" "$tag" "$lock" "$base" "$layer"
    done
    if [ ${#selected[@]} -eq 0 ]; then
        # Package layers of earlier recipes or bases (each a full copy under vfs): every image was just
        # built, so a layer none of them used is dead.
        "${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/pagedinfer-apt:' \
            | grep -vxF -e "$used_layers" | xargs -r "${BUILDAH[@]}" rmi >/dev/null 2>&1 || true
    fi
    # The images these tags named before (vfs keeps every layer as a full copy).
    "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
    log "done in $(since "$start") s: $OUT"
}

main "$@"
