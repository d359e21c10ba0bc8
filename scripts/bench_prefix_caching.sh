#!/usr/bin/env bash
# TTFT with prefix caching on vs off, on the embedded model, with a shared-system-prompt workload.
#   bash scripts/bench_prefix_caching.sh            # defaults below; extra args go to `bench serve`
# Starts `pagedinfer serve` twice on 127.0.0.1 (caching on, then off), runs the same
# `pagedinfer bench serve` against each, prints both summaries and stops the servers with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
PORT="${PORT:-8397}"
BENCH=(--num-prompts "${NUM_PROMPTS:-100}" --request-rate "${REQUEST_RATE:-4}" --dataset synthetic
       --shared-prefix-words "${SHARED_PREFIX_WORDS:-600}" --input-words "${INPUT_WORDS:-16}"
       --output-tokens "${OUTPUT_TOKENS:-16}" --seed 0 --no-progress "$@")
pid=""
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; true' EXIT  # never leave a server behind
for caching in --enable-prefix-caching --no-enable-prefix-caching; do
    .venv/bin/pagedinfer serve --port "$PORT" --log-level warning "$caching" &
    pid=$!
    for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "server $caching not healthy after 120 s"; exit 1; }
    echo "== pagedinfer serve $caching"
    .venv/bin/pagedinfer bench serve --url "http://127.0.0.1:$PORT" "${BENCH[@]}"
    kill -TERM "$pid"
    wait "$pid"
    pid=""
done
