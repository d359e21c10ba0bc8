#!/usr/bin/env bash
# Refreshes the locks in requirements/ from pyproject.toml, then installs them and runs the whole suite.
#
#   bash scripts/lock.sh             # refresh every lock, install dev.lock into .venv, run scripts/test.sh
#   bash scripts/lock.sh --no-test   # refresh the locks only
#   bash scripts/lock.sh --keep --no-test   # add what pyproject.toml gained, every other version kept
#
# Each lock is the newest set of versions that pyproject.toml's ranges allow today, resolved by uv
# (`uv pip compile`, CPython 3.11 on Linux x86_64: CI's machines and the images' Debian bookworm base) under
# requirements/pins.txt (the CPU build of torch, triton), with every file's sha256. What installs from them:
#   dev.lock         scripts/setup.sh (the tests, the demo, CI): every extra and test tool, and the build
#                    requirements (requirements/build.in), since setup.sh builds pagedinfer without isolation
#   engine-cpu.lock  images/engine-cpu.Dockerfile: pagedinfer[engine] and torch's CPU build
#   operator.lock    images/operator.Dockerfile: pagedinfer[operator]
#   router.lock      images/router.Dockerfile: pagedinfer[router]
# The image locks are resolved under dev.lock's versions, so an image runs exactly what the suite tested.
# Refresh when a dependency must move (a fix, a new model family, a security release) or when
# scripts/versions.sh newest finds the newest versions pass; commit the locks with what they needed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
test_after=1
upgrade=(--upgrade)
for arg in "$@"; do
    case "$arg" in
        --no-test) test_after=0 ;;
        # The current locks are uv's preferences: a new dependency is added, nothing else moves.
        --keep) upgrade=() ;;
        *) echo "lock.sh: unknown argument $arg (expected --no-test, --keep)" >&2; exit 2 ;;
    esac
done

# uv: the venv's (uv itself is locked in dev.lock), or $UV (the first lock, a broken venv).
if [ -z "${UV:-}" ]; then
    bash scripts/setup.sh
    UV="$ROOT/.venv/bin/uv"
fi
# Where torch's CPU build lies (this machine's pip find-links, PAGEDINFER_TORCH_INDEX_URL): uv reads no pip config.
mapfile -t SOURCES < <(bash scripts/uv_sources.sh)
COMPILE=("$UV" pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28
         --generate-hashes --no-strip-extras --custom-compile-command "bash scripts/lock.sh"
         "${SOURCES[@]}" --constraint "$ROOT/requirements/pins.txt")

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ "${#upgrade[@]}" = 0 ]; then
    cp requirements/*.lock "$work/"
fi
# From /: uv never puts the working directory on a path, but keep every tool out of the repository root.
(cd / && "${COMPILE[@]}" "${upgrade[@]}" "$ROOT/pyproject.toml" "$ROOT/requirements/build.in" --extra dev \
    -o "$work/dev.lock")
# The same versions, without hashes, as the constraint of the image locks.
sed -e '/^ *--hash/d' -e 's/ \\$//' -e '/^--/d' "$work/dev.lock" >"$work/dev.constraints"
for spec in "engine-cpu|engine|torch" "operator|operator|" "router|router|"; do
    IFS='|' read -r name extra extra_req <<<"$spec"
    inputs=("$ROOT/pyproject.toml" "$ROOT/requirements/build.in")
    if [ -n "$extra_req" ]; then
        echo "$extra_req" >"$work/$name.in"
        inputs+=("$work/$name.in")
    fi
    (cd / && "${COMPILE[@]}" "${inputs[@]}" --extra "$extra" --constraint "$work/dev.constraints" \
        -o "$work/$name.lock")
done
for lock in "$work"/*.lock; do
    # Paths in the "via" comments are this checkout's: write them relative to the repository.
    sed -E -e "s#-c ${work#/}/dev\.constraints#-c requirements/dev.lock#" -e "s#-r ${work#/}/[a-z-]+\.in#-r (the image's torch)#" \
        -e "s#${ROOT#/}/##g" "$lock" >"requirements/$(basename "$lock")"
done
echo "locks written: $(ls requirements/*.lock | tr '\n' ' ')"
[ "$test_after" = 1 ] || exit 0
bash scripts/test.sh
