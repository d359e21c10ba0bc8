"""A serving tensor-parallel replica whose rank 1 dies turns unhealthy on its own, naming the rank."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from proc_tree import children
from serving_harness import start_server, stop_server


@pytest.mark.slow
def test_a_dead_rank_makes_an_idle_server_unhealthy_and_refuse_requests(tiny_llama):
    before = children(os.getpid(), b"pagedinfer.engine.distributed.worker")
    running = start_server(tiny_llama, tensor_parallel_size=2)
    try:
        (rank1,) = children(os.getpid(), b"pagedinfer.engine.distributed.worker") - before
        ok = httpx.post(
            running.url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2}, timeout=60
        )
        assert ok.status_code == 200
        os.kill(rank1, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while httpx.get(running.url + "/health", timeout=10).status_code == 200:
            assert time.monotonic() < deadline, "the server stayed healthy with a dead rank"
            time.sleep(0.1)
        assert "tensor-parallel rank 1" in str(running.engine_loop.engine_error)
        refused = httpx.post(
            running.url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2}, timeout=60
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
    finally:
        stop_server(running)
