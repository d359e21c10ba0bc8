"""The grammar backend's one-time set-up happens while the server loads, never in a step.

A first structured-output request once made every running request wait
seconds (its first step imported `llguidance.torch`, which imports
torch._dynamo). Here the backend's imports are held on purpose
(tests/support/slow_grammar_backend.py: each first import of an llguidance
module waits SETUP_DELAY_SECONDS and says so on stderr): every one of them is
said before the server answers /health, and none after a first json_schema
request has been answered. Its steps ran, so an import left for them would
have been held there, stalling every running stream, and said so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from engine_process import tiny_serve_args

from pagedinfer.testing.server_process import free_port, wait_process_healthy

SLOW_BACKEND = Path(__file__).resolve().parents[1] / "support" / "slow_grammar_backend.py"
SETUP_DELAY_SECONDS = 0.5
HELD = "slow_grammar_backend: held the import of"  # slow_grammar_backend.HELD (which imports the engine's CLI)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.slow
def test_a_first_structured_request_imports_nothing_in_a_step(tiny_llama, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SLOW_BACKEND),
            str(SETUP_DELAY_SECONDS),
            *tiny_serve_args(tiny_llama, port, max_model_len=256, num_gpu_blocks=64),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    try:
        wait_process_healthy(url, proc, timeout_seconds=180, log_path=log_path)
        held = log_path.read_text().count(HELD)
        assert held, "the server answered /health without having set up the grammar backend"
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        out = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Where?"}],
            max_tokens=16,
            response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}},
        )
        assert out.choices[0].message.content.startswith("{")
        output = log_path.read_text()
        assert output.count(HELD) == held, output[-3000:]
    finally:
        proc.kill()
        proc.wait()
        log.close()
