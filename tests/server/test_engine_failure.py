"""An unexpected engine exception is never silent: every in-flight request gets a 500, /health turns 503,
the traceback is logged once and `pagedinfer serve` exits non-zero so the kubelet restarts the pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from engine_process import tiny_serve_args
from serving_harness import serve_app, stop_server, wait_healthy

from pagedinfer.testing.server_process import free_port, wait_process_healthy

FAULT_WRAPPER = Path(__file__).resolve().parents[1] / "support" / "engine_fault.py"
LONG = {"model": "tiny", "prompt": "Keep talking", "max_tokens": 1000, "ignore_eos": True}


class Stream(threading.Thread):
    """A streaming completion read to its end; `started` once its first token arrived."""

    def __init__(self, url: str, hang_up_after_first_token: bool = False) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.hang_up = hang_up_after_first_token
        self.started = threading.Event()
        self.events: list[str] = []
        self.status: int | None = None

    def run(self) -> None:
        with httpx.stream("POST", self.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                self.events.append(line[6:])
                if '"text":"' in line and not self.started.is_set():
                    self.started.set()
                    if self.hang_up:
                        return

    def assert_ended_with_a_500_event(self) -> None:
        assert self.status == 200 and self.events[-1] == "[DONE]", self.events[-3:]
        error = json.loads(self.events[-2])["error"]
        assert error["code"] == "internal_error" and error["type"] == "server_error", error


class Post(threading.Thread):
    """A non-streaming completion; `response` once answered."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.response: httpx.Response | None = None

    def run(self) -> None:
        self.response = httpx.post(self.url + "/v1/completions", json=LONG, timeout=60)

    def assert_answered_500(self) -> None:
        assert self.response is not None and self.response.status_code == 500, self.response
        assert self.response.json()["error"]["code"] == "internal_error"


def _wait_running(url: str, count: int, timeout_seconds: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while True:
        lines = httpx.get(url + "/metrics", timeout=10).text.splitlines()
        running = [ln for ln in lines if ln.startswith("pagedinfer_num_requests_running{")]
        if running and float(running[0].split()[-1]) >= count:
            return
        assert time.monotonic() < deadline, f"{count} requests never ran together"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["step_deltas", "add_request", "abort_request"])  # what the engine loop calls
def test_a_fault_in_a_real_serve_process_answers_every_request_500_and_exits_1(method, tiny_llama, tmp_path):
    """The fault is injected into LLMEngine.<method> of a real `pagedinfer serve` process (engine_fault.py)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    trigger = tmp_path / "fault"
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAULT_WRAPPER),
            method,
            str(trigger),
            *tiny_serve_args(tiny_llama, port, max_model_len=1024, num_gpu_blocks=256),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    try:
        wait_process_healthy(url, proc)
        streams = [Stream(url) for _ in range(3)]
        post = Post(url)
        for client in (*streams, post):
            client.start()
        for s in streams:
            assert s.started.wait(60)
        _wait_running(url, 4)
        trigger.touch()
        if method == "add_request":
            late = Post(url)  # its add is the call that fails
            late.start()
            late.join(60)
            late.assert_answered_500()
        elif method == "abort_request":
            leaving = Stream(url, hang_up_after_first_token=True)  # its abort is the call that fails
            leaving.start()
            leaving.join(60)
        code = proc.wait(timeout=60)
        for client in (*streams, post):
            client.join(30)
            assert not client.is_alive()
        for s in streams:
            s.assert_ended_with_a_500_event()
        post.assert_answered_500()
        assert code == 1
        log.seek(0)
        output = log.read()
        assert output.count("Traceback") == 1, output[-4000:]
        assert f"injected fault in LLMEngine.{method}" in output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_health_is_503_and_new_requests_are_refused_once_the_engine_failed(tiny_llama):
    """In-process (so nothing exits): a request whose add_request raises fails the stream in flight too."""
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine.server.app import ServerSettings, create_app
    from pagedinfer.engine.server.engine_loop import EngineLoop
    from pagedinfer.engine.server.launcher import engine_factory
    from pagedinfer.engine.server.metrics import ServerMetrics

    fault = threading.Event()
    load = engine_factory(
        EngineConfig(model=str(tiny_llama), device="cpu", max_model_len=1024, num_gpu_blocks_override=128), "tiny"
    )

    def faulty_load():
        engine, info = load()
        add_request = engine.add_request

        def faulty_add_request(*args, **kwargs):
            if fault.is_set():
                raise TypeError("injected fault in add_request")
            return add_request(*args, **kwargs)

        engine.add_request = faulty_add_request
        return engine, info

    metrics = ServerMetrics("tiny")
    loop = EngineLoop(faulty_load, observer=metrics)
    running = serve_app(create_app(loop, metrics, ServerSettings()), loop)
    try:
        wait_healthy(running)
        stream = Stream(running.url)
        stream.start()
        assert stream.started.wait(60)
        fault.set()
        late = Post(running.url)
        late.start()
        late.join(60)
        late.assert_answered_500()
        stream.join(60)
        stream.assert_ended_with_a_500_event()
        assert httpx.get(running.url + "/health").status_code == 503
        refused = httpx.post(running.url + "/v1/completions", json={**LONG, "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
    finally:
        stop_server(running)
