"""`pagedinfer serve` as a child process: a free port to give it, and a wait until it answers /health."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_process_healthy(url: str, proc: subprocess.Popen, timeout_seconds: float = 120.0) -> None:
    """Poll url/health until 200; fail at once if the process exits first."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "server exited before becoming healthy"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError("server did not become healthy")
