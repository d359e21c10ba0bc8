#!/usr/bin/env bash
# Creates .venv and installs pagedinfer with every extra and test tool.
# Idempotent: a second run with the same pyproject.toml and this script does nothing (a stamp in
# .venv). Used by scripts/test.sh and scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
ROOT="$PWD"
# Never `python -m ...` with the repo root as the working directory: -m puts the
# cwd on sys.path, where the folder operator/ would shadow the standard library.
if [ ! -x .venv/bin/python ]; then
    (cd / && "$PYTHON" -m venv "$ROOT/.venv")
fi
# The stamp: what the last complete install was made from. The same inputs again (scripts/test.sh runs this
# after .ci/run did) skip torch's import check and pip's whole resolve of every extra (measured: 64 s -> 0 s on a
# loaded machine).
STAMP=.venv/.pagedinfer-setup
inputs="$(cat pyproject.toml scripts/setup.sh; echo "${PAGEDINFER_TORCH_INDEX_URL:-}")"
inputs="$(printf '%s' "$inputs" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" = "$inputs" ] && [ -x .venv/bin/pagedinfer ]; then
    exit 0
fi
PIP=(.venv/bin/pip install --disable-pip-version-check -q --no-compile)
# torch first and pinned: the tests need no GPU, and an unpinned torch from PyPI is a
# multi-GB CUDA build. Where the package index serves CUDA builds (plain PyPI), set
# PAGEDINFER_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU wheel
# (its 2.13.0+cpu outranks PyPI's 2.13.0); this project's machines carry a CPU wheel locally.
TORCH_INDEX=()
if [ -n "${PAGEDINFER_TORCH_INDEX_URL:-}" ]; then
    TORCH_INDEX=(--extra-index-url "$PAGEDINFER_TORCH_INDEX_URL")
fi
if ! (cd / && "$ROOT/.venv/bin/python" -c "import torch, triton") 2>/dev/null; then
    "${PIP[@]}" "${TORCH_INDEX[@]}" "torch==2.13.0" "triton==3.8.0"
fi
"${PIP[@]}" -e ".[dev]"
echo "$inputs" >"$STAMP"
