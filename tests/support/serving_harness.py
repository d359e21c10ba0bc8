"""A real pagedinfer server (uvicorn on 127.0.0.1, a free port) in a background thread, for tests/server."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class RunningServer:
    url: str
    model: str
    engine_loop: Any
    uvicorn: Any
    api_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics keyed by 'name{labels}' (labels sorted, as Prometheus prints them)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", timeout=10).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples

    def wait_idle(self, timeout_seconds: float = 30.0) -> dict[str, float]:
        """Metrics once no request is running or waiting and every block is free."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            m = self.metrics()
            idle = m.get("pagedinfer_num_requests_running") == 0 and m.get("pagedinfer_num_requests_waiting") == 0
            if idle and m.get("pagedinfer_kv_cache_free_blocks") == m.get("pagedinfer_kv_cache_num_blocks"):
                return m
            if time.monotonic() > deadline:
                return m
            time.sleep(0.05)


def start_server(
    model_dir,
    *,
    api_key: str | None = None,
    served_model_name: str = "tiny",
    max_waiting_requests: int | None = None,
    max_request_body_bytes: int = 1 << 20,
    header_timeout_seconds: float | None = None,
    body_timeout_seconds: float | None = None,
    kv_events=None,
    **engine_overrides,
) -> RunningServer:
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine.server.app import ServerSettings
    from pagedinfer.engine.server.launcher import build_app

    engine_kwargs = dict(
        model=str(model_dir), device="cpu", max_model_len=256, num_gpu_blocks_override=128, block_size=16
    )
    engine_kwargs.update(engine_overrides)
    timeouts = {} if body_timeout_seconds is None else {"body_timeout_seconds": body_timeout_seconds}
    settings = ServerSettings(
        api_key=api_key,
        max_waiting_requests=max_waiting_requests,
        max_request_body_bytes=max_request_body_bytes,
        **timeouts,
    )
    app, loop = build_app(EngineConfig(**engine_kwargs), settings, served_model_name, kv_events)
    running = serve_app(app, loop, served_model_name, api_key, header_timeout_seconds)
    wait_healthy(running)
    return running


def serve_app(
    app, loop, served_model_name: str = "tiny", api_key: str | None = None, header_timeout_seconds: float | None = None
) -> RunningServer:
    """Run uvicorn for `app` on a free 127.0.0.1 port in a daemon thread."""
    from pagedinfer.engine.server.launcher import uvicorn_server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    timeouts = {} if header_timeout_seconds is None else {"header_timeout_seconds": header_timeout_seconds}
    server = uvicorn_server(app, "127.0.0.1", port, shutdown_grace_seconds=5.0, log_level="warning", **timeouts)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    running = RunningServer(f"http://127.0.0.1:{port}", served_model_name, loop, server, api_key)
    running.thread = thread
    return running


def wait_healthy(running: RunningServer, timeout_seconds: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(running.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if running.engine_loop.load_error is not None:
            raise running.engine_loop.load_error
        time.sleep(0.05)
    raise TimeoutError("server did not become healthy")


def stop_server(running: RunningServer) -> None:
    running.uvicorn.should_exit = True
    running.thread.join(30)
