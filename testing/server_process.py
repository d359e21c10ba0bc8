"""`pagedinfer serve` as a child process: a free port to give it, and a wait until it answers /health."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from pathlib import Path

import httpx

from pagedinfer.testing.watched import exit_report
from pagedinfer.testing.worker_share import port_range

# Ports for children are drawn from [_FIRST_PORT, the kernel's ephemeral range): every outgoing connection of
# every process takes its local port from that range, so a port found free there (as binding port 0 finds one)
# can be taken by some connection before the child binds it (seen in CI: "address already in use").
_FIRST_PORT = 20000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port of 127.0.0.1 free now, for a child process to bind: below the ephemeral range (above), in this
    process's share of those (worker_share.py: pytest-xdist's workers draw from disjoint ones), never the
    same twice in this process, drawn at random so that two test processes rarely try the same one."""
    ports = port_range(_FIRST_PORT, _ephemeral_low())
    if len(ports) < 1000:  # an unusual range: fall back to one the kernel picks
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(1000):
        port = random.randrange(ports.start, ports.stop)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port of 127.0.0.1 in [{ports.start}, {ports.stop})")


def wait_process_healthy(
    url: str, proc: subprocess.Popen, timeout_seconds: float = 120.0, log_path: Path | None = None
) -> None:
    """Poll url/health until 200; fail at once if the process exits first, with its exit code and, given
    the file its output goes to, the tail of that log (watched.exit_report)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            raise AssertionError(
                exit_report(f"server {url} (pid {proc.pid})", code, log_path, " before it was healthy")
            )
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"server {url} (pid {proc.pid}) did not become healthy within {timeout_seconds:g} s")
