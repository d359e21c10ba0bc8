"""A real `pagedinfer router` app (uvicorn on 127.0.0.1, a free port) in a background thread."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from pagedinfer.testing.watched import exit_report


class RunningRouter:
    def __init__(self, app, url: str, server, thread) -> None:
        self.app, self.url, self.server, self.thread = app, url, server, thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_router(
    engine_urls, tokenizer_dir, policy: str = "prefix", api_key: str | None = None, discovery=None, **settings
) -> RunningRouter:
    """settings: more RouterSettings fields, by name."""
    from pagedinfer.engine.server.launcher import uvicorn_server
    from pagedinfer.router.app import RouterSettings, create_router_app

    tokenizer = None if tokenizer_dir is None else str(tokenizer_dir)  # None: the engines' own, fetched
    app = create_router_app(RouterSettings(tuple(engine_urls), policy, api_key, tokenizer, discovery, **settings))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn_server(app, "127.0.0.1", 0, shutdown_grace_seconds=2.0, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    router = RunningRouter(app, url, server, thread)
    wait_for(lambda: server.started, "the router never started")
    wait_for(lambda: _healthy_engines(router) == len(engine_urls), "the router never saw every engine healthy")
    return router


def start_router_process(url: str, args: list[str], log_path: Path, cwd: Path | None = None) -> subprocess.Popen:
    """`pagedinfer router ARGS` from this venv (in `cwd`, else ours), once it answers /health (200, or 503
    without a healthy engine)."""
    cli = Path(sys.executable).with_name("pagedinfer")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(cli), "router", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            cwd=cwd,
        )

    def answers() -> bool:
        code = proc.poll()
        assert code is None, exit_report(
            f"pagedinfer router (pid {proc.pid})", code, log_path, " before it answered /health"
        )
        try:
            return httpx.get(url + "/health", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, "the router never answered /health")
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    return proc


def _healthy_engines(router: RunningRouter) -> int:
    try:
        state = router.app.state.router
    except AttributeError:
        return 0
    return sum(1 for e in state.engines.values() if e.healthy and e.block_size)


def wait_for(condition, message: str, timeout_seconds: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


async def until(condition, timeout_seconds: float = 60.0) -> None:
    """Return once condition() holds, polling from the event loop (a bound on a wait, not a timed assertion)."""
    for _ in range(int(timeout_seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition never held")


def route_of(response: httpx.Response) -> dict[str, str]:
    return dict(part.strip().split("=", 1) for part in response.headers["x-pagedinfer-route"].split(";"))
