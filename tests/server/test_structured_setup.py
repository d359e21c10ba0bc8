"""The grammar backend's one-time set-up happens while the server loads, never in a step.

A first structured-output request once made every running request wait
seconds (its first step imported `llguidance.torch`, which imports
torch._dynamo). Here the backend is made slow to load on purpose
(tests/support/slow_grammar_backend.py: each llguidance import takes
SETUP_DELAY_SECONDS more): a stream that is running when the first json_schema
request arrives keeps its pace, the gap between its chunks staying far below
that delay.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from pagedinfer.testing.server_process import free_port, wait_process_healthy

SLOW_BACKEND = Path(__file__).resolve().parents[1] / "support" / "slow_grammar_backend.py"
SETUP_DELAY_SECONDS = 3.0
MAX_GAP_SECONDS = 1.0  # a tiny model's stream writes every few ms; the broken server paused >= 3 s
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class PlainStream(threading.Thread):
    """A long plain completion, streamed; the arrival time of each of its chunks."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.arrivals: list[float] = []
        self.started = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        body = {"model": "tiny", "prompt": "Keep talking", "max_tokens": 16000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        self.arrivals.append(time.monotonic())
                        self.started.set()
                    if self.stop.is_set():
                        return
        except httpx.TransportError:
            pass  # the server was killed under it (a failed test's clean-up)


@pytest.mark.slow
def test_a_first_structured_request_does_not_pause_a_running_stream(make_model, tmp_path):
    model = make_model("llama", max_position_embeddings=16384)  # room for a stream that outlasts the set-up
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SLOW_BACKEND),
            str(SETUP_DELAY_SECONDS),
            "serve",
            "--model",
            str(model),
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--max-model-len",
            "16384",
            "--num-gpu-blocks-override",
            "1100",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    try:
        wait_process_healthy(url, proc, timeout_seconds=180, log_path=log_path)
        plain = PlainStream(url)
        plain.start()
        assert plain.started.wait(60)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        sent = time.monotonic()
        out = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Where?"}],
            max_tokens=16,
            response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}},
        )
        done = time.monotonic()
        assert out.choices[0].message.content.startswith("{")
        assert plain.is_alive() and plain.arrivals[-1] > done - 0.5, "the stream ended before the request did"
        window = [t for t in plain.arrivals if sent - 0.5 <= t <= done] + [done]
        gap = max(b - a for a, b in zip(window, window[1:]))
        print(f"structured request: {done - sent:.2f}s; the stream's longest gap meanwhile: {gap:.3f}s")
        assert gap < MAX_GAP_SECONDS
        plain.stop.set()
    finally:
        proc.kill()
        proc.wait()
        log.close()
