#!/usr/bin/env bash
# Installs the lowest or the newest versions that pyproject.toml allows into a venv of their own, then runs
# the tests that use each direct dependency there.
#
#   bash scripts/versions.sh floors            # .venv-floors: each direct dependency at its floor
#   bash scripts/versions.sh newest            # .venv-newest: everything at the newest release today
#   bash scripts/versions.sh floors --all      # the whole suite (less tests/images) instead of the selection
#   bash scripts/versions.sh newest -- -x -k tp   # arguments after -- go to pytest
#   bash scripts/versions.sh floors -- tests/operator/test_cli.py   # test paths after -- replace the selection
#
# floors: uv's lowest-direct resolution (`uv pip compile --resolution lowest-direct`): every package that
#   pyproject.toml names directly at the lowest version its range allows, the rest resolved around them. A
#   floor that fails here is false: raise it in pyproject.toml, or make the code work at it.
# newest: the newest release of everything, as scripts/lock.sh would lock it today: the canary that tells,
#   before a lock refresh (or a user's unlocked `pip install pagedinfer`), what the next releases break.
# Both hold torch and triton at requirements/pins.txt: torch's CPU build is the only one this project's
#   machines can install (PyPI's Linux torch is the CUDA build, several GB); the engine's other torch
#   releases are checked on a GPU machine (../shared/gpu/).
# The resolution it installed is written to .venv-<mode>/resolved.txt, and the run's versions of the direct
# dependencies are printed first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
mode="${1:-}"
case "$mode" in
    floors) resolution=(--resolution lowest-direct) ;;
    newest) resolution=(--resolution highest) ;;
    *) echo "usage: bash scripts/versions.sh floors|newest [--all] [-- pytest args]" >&2; exit 2 ;;
esac
shift
all=0
if [ "${1:-}" = "--all" ]; then all=1; shift; fi
[ "${1:-}" = "--" ] && shift

# The tests that use each direct dependency (one line a group: the packages, then the tests).
GROUPS_=(
    "torch transformers tokenizers tqdm|tests/engine/test_matches_transformers.py tests/engine/test_model_loading.py tests/engine/test_detokenizer.py tests/engine/test_beam_matches_transformers.py tests/engine/test_fused_layers.py tests/engine/test_tensor_parallel.py tests/engine/test_sampler.py"
    "llguidance|tests/engine/test_structured_outputs.py tests/server/test_structured_outputs_api.py"
    "fastapi uvicorn prometheus-client httpx openai|tests/server/test_openai_client.py tests/server/test_streaming.py tests/server/test_metric_names.py tests/server/test_bad_requests.py tests/server/test_read_timeouts.py"
    "pyzmq msgpack|tests/engine/test_kv_events.py tests/server/test_kv_events.py"
    "ninja|tests/kernels/test_cpu_prebuilt.py"
    "jinja2 (router)|tests/router/test_router_e2e.py tests/router/test_policy.py tests/router/test_request_tokens.py"
    "kopf aiohttp kmock pyyaml|tests/operator/test_e2e_reconcile.py tests/operator/test_e2e_status.py tests/operator/test_cli.py tests/operator/test_kube_emulator.py"
    "jsonschema kubernetes-validate|tests/operator/test_crd_schema.py"
    "hypothesis|tests/engine/test_block_pool.py tests/engine/test_kv_cache_manager.py"
    "schemathesis|tests/server/test_schemathesis.py"
    "lm-eval|tests/server/test_lm_eval.py"
    "matplotlib|tests/bench"
)

VENV="$ROOT/.venv-$mode"
if [ ! -x "$VENV/bin/python" ]; then
    (cd / && "${PYTHON:-python3}" -m venv "$VENV")
fi
bash scripts/setup.sh   # the project's venv, for its uv (locked in dev.lock)
UV="$ROOT/.venv/bin/uv"
mapfile -t SOURCES < <(bash scripts/uv_sources.sh)
start=$SECONDS
# From /: keep the repository root out of every tool's working directory.
(cd / && "$UV" pip compile --quiet --python-version 3.11 --no-header --no-annotate "${resolution[@]}" \
    --upgrade "${SOURCES[@]}" --override "$ROOT/requirements/pins.txt" \
    "$ROOT/pyproject.toml" "$ROOT/requirements/build.in" --extra dev -o "$VENV/resolved.txt")
(cd / && "$UV" --quiet pip sync --python "$VENV/bin/python" "${SOURCES[@]}" "$VENV/resolved.txt")
(cd / && "$UV" --quiet pip install --python "$VENV/bin/python" --no-deps --no-build-isolation --no-index -e "$ROOT")
echo "versions.sh $mode: resolved and installed in $((SECONDS - start)) s ($VENV/resolved.txt)"

# The direct dependencies, as installed.
direct="$("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
names = set()
for reqs in project["optional-dependencies"].values():
    for req in reqs:
        name = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()
        if name != "pagedinfer":
            names.add(name)
print(" ".join(sorted(names)))
EOF
)"
echo "direct dependencies, $mode:"
for name in $direct; do
    printf '  %s\n' "$(grep -i "^${name}==" "$VENV/resolved.txt" || echo "$name (not installed)")"
done

explicit=0
for arg in "$@"; do
    case "$arg" in tests/*) explicit=1 ;; esac
done
if [ "$explicit" = 1 ]; then
    tests=()   # test paths after -- replace the selection
elif [ "$all" = 1 ]; then
    tests=(tests --ignore=tests/images)
else
    tests=()
    for group in "${GROUPS_[@]}"; do
        IFS='|' read -r packages files <<<"$group"
        echo "  $packages: $files"
        # shellcheck disable=SC2206  # a word list
        tests+=($files)
    done
fi
export PATH="$ROOT/.tools/bin:$PATH" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONPYCACHEPREFIX="$VENV/pycache"
unset PYTHONDONTWRITEBYTECODE
bash scripts/fetch_helm.sh
# Never `python -m pytest` from the repo root (it would put the root on sys.path).
exec "$VENV/bin/pytest" -q -rfE "${tests[@]}" "$@"
