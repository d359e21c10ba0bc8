"""A serving tensor-parallel replica whose rank 1 dies turns unhealthy on its own, naming the rank."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from serving_harness import start_server, stop_server


def _rank_pids() -> set[int]:
    """This process's tensor-parallel worker children."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"pagedinfer.engine.distributed.worker" in cmdline:
            found.add(int(proc.name))
    return found


@pytest.mark.slow
def test_a_dead_rank_makes_an_idle_server_unhealthy_and_refuse_requests(tiny_llama):
    before = _rank_pids()
    running = start_server(tiny_llama, tensor_parallel_size=2)
    try:
        (rank1,) = _rank_pids() - before
        ok = httpx.post(running.url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2},
                        timeout=60)
        assert ok.status_code == 200
        os.kill(rank1, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while httpx.get(running.url + "/health", timeout=10).status_code == 200:
            assert time.monotonic() < deadline, "the server stayed healthy with a dead rank"
            time.sleep(0.1)
        assert "tensor-parallel rank 1" in str(running.engine_loop.engine_error)
        refused = httpx.post(running.url + "/v1/completions",
                             json={"model": "tiny", "prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
    finally:
        stop_server(running)
