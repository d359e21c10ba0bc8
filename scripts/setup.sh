#!/usr/bin/env bash
# Creates .venv and installs pagedinfer with every extra and test tool.
# Idempotent: a second run only checks. Used by scripts/test.sh and scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
ROOT="$PWD"
# Never `python -m ...` with the repo root as the working directory: -m puts the
# cwd on sys.path, where the folder operator/ would shadow the standard library.
if [ ! -x .venv/bin/python ]; then
    (cd / && "$PYTHON" -m venv "$ROOT/.venv")
fi
PIP=(.venv/bin/pip install --disable-pip-version-check -q)
# torch first and pinned: on these machines torch==2.13.0 is a local CPU wheel,
# while an unpinned torch would pull a multi-GB CUDA build.
if ! (cd / && "$ROOT/.venv/bin/python" -c "import torch, triton") 2>/dev/null; then
    "${PIP[@]}" "torch==2.13.0" "triton==3.8.0"
fi
"${PIP[@]}" -e ".[dev]"
