#!/usr/bin/env bash
# Creates .venv and installs exactly requirements/dev.lock into it: every extra and test tool at the
# versions and sha256 hashes CI tested (`uv pip sync`: nothing more, nothing less), then pagedinfer itself
# (editable, without build isolation: its build requirements are locked too). scripts/lock.sh refreshes
# the lock; docs/testing.md says when.
# Idempotent: a second run with the same inputs does nothing (a stamp in .venv). Used by scripts/test.sh
# and scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
ROOT="$PWD"
LOCK="${PAGEDINFER_LOCK:-requirements/dev.lock}"
# Never `python -m ...` with the repo root as the working directory: -m puts the
# cwd on sys.path, where the folder operator/ would shadow the standard library.
if [ ! -x .venv/bin/python ]; then
    if ! (cd / && "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'); then
        echo "setup.sh: pagedinfer needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1) (set PYTHON)" >&2
        exit 1
    fi
    (cd / && "$PYTHON" -m venv "$ROOT/.venv")
fi
# The stamp: what the last complete install was made from. The same inputs again (scripts/test.sh runs this
# after .ci/run did) skip the install.
STAMP=.venv/.pagedinfer-setup
inputs="$(cat pyproject.toml scripts/setup.sh "$LOCK"; echo "${PAGEDINFER_TORCH_INDEX_URL:-}")"
inputs="$(printf '%s' "$inputs" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" = "$inputs" ] && [ -x .venv/bin/pagedinfer ]; then
    exit 0
fi
start=$SECONDS
# uv, at the lock's own version and hashes, with the venv's pip.
uv_version="$(sed -n 's/^uv==\([^ ]*\).*/\1/p' "$LOCK")"
if [ "$(.venv/bin/uv --version 2>/dev/null | cut -d' ' -f2)" != "$uv_version" ]; then
    awk '/^uv==/ { on = 1 } on { print } on && !/\\$/ { exit }' "$LOCK" >.venv/uv.lock.txt
    (cd / && "$ROOT/.venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --require-hashes \
        -r "$ROOT/.venv/uv.lock.txt")
fi
# torch's CPU build: from this machine's pip find-links (this project's machines keep it on disk), or from
# PAGEDINFER_TORCH_INDEX_URL (https://download.pytorch.org/whl/cpu) where the package index has only CUDA builds.
mapfile -t SOURCES < <(bash scripts/uv_sources.sh)
UV=(.venv/bin/uv --quiet pip)
# No bytecode now (uv's default): each module's is written once, by the first process that imports it
# (scripts/test.sh), and only for what is imported.
"${UV[@]}" sync --python .venv/bin/python --require-hashes "${SOURCES[@]}" "$LOCK"
"${UV[@]}" install --python .venv/bin/python --no-deps --no-build-isolation --no-index -e .
echo "setup.sh: installed $LOCK into .venv in $((SECONDS - start)) s"
echo "$inputs" >"$STAMP"
