"""Ctrl-C twice: the second one ends the grace period at once, and the shutdown stays orderly.

`pagedinfer serve` as a real process with a long grace period and long
requests in flight: after the first SIGINT they run on (draining); after the
second, each is answered as a shutdown answers it (a non-streamed one with a
JSON 503 in OpenAI's shape, a stream with an error event then [DONE]), the
log holds no traceback and no ERROR, and the process exits 130 (Ctrl-C's
status), long before the grace period would have ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from engine_process import tiny_serve_args
from router_harness import wait_for

from pagedinfer.testing.server_process import free_port, wait_process_healthy

GRACE_SECONDS = 120.0
LONG = {"model": "tiny", "prompt": "Keep talking", "max_tokens": 16000, "ignore_eos": True}


class Client(threading.Thread):
    """One long completion, streamed or not; what it got back."""

    def __init__(self, url: str, stream: bool) -> None:
        super().__init__(daemon=True)
        self.url, self.stream = url, stream
        self.started = threading.Event()
        self.status: int | None = None
        self.content_type = ""
        self.body: dict | None = None
        self.events: list[str] = []

    def run(self) -> None:
        if not self.stream:
            self.started.set()
            r = httpx.post(self.url + "/v1/completions", json=LONG, timeout=60)
            self.status, self.content_type = r.status_code, r.headers.get("content-type", "")
            self.body = r.json() if self.content_type.startswith("application/json") else {"text": r.text}
            return
        with httpx.stream("POST", self.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    self.started.set()


@pytest.mark.slow
def test_a_second_sigint_answers_every_request_and_exits_in_order(make_model, tmp_path):
    model = make_model("llama", max_position_embeddings=16384)  # requests that outlast the test
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    log = log_path.open("w")
    cli = os.path.join(os.path.dirname(sys.executable), "pagedinfer")
    proc = subprocess.Popen(
        [
            cli,
            *tiny_serve_args(model, port, max_model_len=16384, num_gpu_blocks=3200),
            "--shutdown-grace-seconds",
            str(GRACE_SECONDS),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    try:
        wait_process_healthy(url, proc, log_path=log_path)
        clients = [Client(url, stream=True), Client(url, stream=True), Client(url, stream=False)]
        for c in clients:
            c.start()
        for c in clients:
            assert c.started.wait(60)
        time.sleep(0.5)  # the non-streamed one reached the engine too
        proc.send_signal(signal.SIGINT)
        # draining: uvicorn says it is shutting down (the signal's handler began the drain before that), and
        # then the streams still get tokens, two passes of the engine at least: the requests run on
        wait_for(lambda: "Shutting down" in log_path.read_text(), "the first SIGINT never began the shutdown")
        received = [len(c.events) for c in clients[:2]]
        wait_for(
            lambda: all(len(c.events) >= n + 2 or not c.is_alive() for c, n in zip(clients[:2], received)),
            "the streams stalled after the first SIGINT",
        )
        assert all(c.is_alive() for c in clients), "a request ended after the first SIGINT"
        signaled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        exited_after = time.monotonic() - signaled
        for c in clients:
            c.join(30)
        output = log_path.read_text()
        print(f"exited {exited_after:.2f}s after the second SIGINT, status {code}")
        for c in clients[:2]:
            assert c.status == 200 and c.events[-1] == "[DONE]", c.events[-3:]
            error = json.loads(c.events[-2])["error"]
            assert error["code"] == "shutting_down" and error["type"], error
        post = clients[2]
        assert post.status == 503 and post.content_type.startswith("application/json"), (post.status, post.body)
        assert post.body["error"]["code"] == "shutting_down" and "message" in post.body["error"], post.body
        assert code == 130, output
        assert "Traceback" not in output and " ERROR " not in output, output
        assert exited_after < GRACE_SECONDS / 4
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
