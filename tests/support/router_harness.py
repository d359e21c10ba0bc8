"""A real `pagedinfer router` app (uvicorn on 127.0.0.1, a free port) in a background thread."""

from __future__ import annotations

import socket
import threading
import time

import httpx


class RunningRouter:
    def __init__(self, app, url: str, server, thread) -> None:
        self.app, self.url, self.server, self.thread = app, url, server, thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_router(engine_urls, tokenizer_dir, policy: str = "prefix", api_key: str | None = None,
                 discovery=None) -> RunningRouter:
    from pagedinfer.engine.server.launcher import uvicorn_server
    from pagedinfer.router.app import RouterSettings, create_router_app

    app = create_router_app(RouterSettings(tuple(engine_urls), policy, api_key, str(tokenizer_dir), discovery))
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



def route_of(response: httpx.Response) -> dict[str, str]:
    return dict(part.strip().split("=", 1) for part in response.headers["x-pagedinfer-route"].split(";"))
