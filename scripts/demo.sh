#!/usr/bin/env bash
# The main job, end to end on a fresh machine: install, start `pagedinfer serve` on the
# embedded default model, ask it once with curl and once with the openai Python client,
# print the answers, then stop the server with SIGTERM (a graceful shutdown exits 0).
#   bash scripts/demo.sh          # PORT=8000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PORT="${PORT:-8000}"
URL="http://127.0.0.1:$PORT"
LOG="$(mktemp -t pagedinfer-serve.XXXXXX.log)"

OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" .venv/bin/pagedinfer serve --port "$PORT" >"$LOG" 2>&1 &
PID=$!
stop_server() {
    if kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID"
        wait "$PID" && echo "server stopped cleanly (exit 0)" || echo "server exited with status $?"
    fi
}
trap stop_server EXIT

echo "waiting for $URL/health ..."
for _ in $(seq 1 240); do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "the server exited early; its log:"; cat "$LOG"; exit 1
    fi
    curl -sf "$URL/health" >/dev/null && break
    sleep 0.5
done
curl -sf "$URL/health" >/dev/null || { echo "not healthy after 120 s; log:"; cat "$LOG"; exit 1; }

echo
echo "== curl: POST /v1/chat/completions"
curl -sf "$URL/v1/chat/completions" -H "Content-Type: application/json" -d '{
    "model": "pagedinfer-default",
    "messages": [{"role": "user", "content": "What does json.dumps do?"}],
    "max_tokens": 40, "temperature": 0
}' | .venv/bin/python -c 'import json, sys; r = json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print("usage:", r["usage"])'

echo
echo "== openai client: completions (streamed) and chat"
PAGEDINFER_URL="$URL" .venv/bin/python - <<'PY'
import os

from openai import OpenAI

client = OpenAI(base_url=os.environ["PAGEDINFER_URL"] + "/v1", api_key="unused")
stream = client.completions.create(model="pagedinfer-default", prompt="Return the", max_tokens=32,
                                   temperature=0, stream=True)
print("Return the" + "".join(chunk.choices[0].text for chunk in stream if chunk.choices))
chat = client.chat.completions.create(model="pagedinfer-default", max_tokens=40, temperature=0,
                                      messages=[{"role": "user", "content": "Explain os.path.join."}])
print(chat.choices[0].message.content)
PY
echo
