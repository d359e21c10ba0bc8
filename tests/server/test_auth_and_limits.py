"""API key, body size limit, waiting-queue limit, readiness, and the open endpoints."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest
from serving_harness import serve_app, start_server, stop_server, wait_healthy

KEY = "sk-test-7f3a9c1e5b"


@pytest.fixture(scope="module")
def keyed_server(tiny_llama):
    running = start_server(tiny_llama, api_key=KEY, max_request_body_bytes=4096)
    yield running
    stop_server(running)


def completion(**fields):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
    body.update(fields)
    return body


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"}],
                         ids=["missing", "wrong", "no-scheme", "basic", "longer"])
def test_v1_requires_the_bearer_key(keyed_server, headers):
    r = httpx.post(keyed_server.url + "/v1/completions", json=completion(), headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    assert KEY not in r.text
    assert httpx.get(keyed_server.url + "/v1/models", headers=headers).status_code == 401


def test_the_right_key_is_accepted_and_checked_before_the_body(keyed_server):
    r = httpx.post(keyed_server.url + "/v1/completions", json=completion(), headers=keyed_server.headers())
    assert r.status_code == 200
    r = httpx.post(keyed_server.url + "/v1/completions", content=b"{not json", headers={})
    assert r.status_code == 401  # unauthenticated clients learn nothing about body parsing


def test_health_metrics_and_version_stay_open(keyed_server):
    assert httpx.get(keyed_server.url + "/health").status_code == 200
    assert httpx.get(keyed_server.url + "/metrics").status_code == 200
    version = httpx.get(keyed_server.url + "/version")
    assert version.status_code == 200 and version.json()["version"]


def test_the_key_never_reaches_the_logs(keyed_server, caplog):
    with caplog.at_level(logging.DEBUG):
        httpx.post(keyed_server.url + "/v1/completions", json=completion(), headers={"Authorization": "Bearer bad"})
        httpx.post(keyed_server.url + "/v1/completions", json=completion(), headers=keyed_server.headers())
    assert KEY not in caplog.text


def test_api_key_comes_from_the_environment_when_no_flag(monkeypatch):
    from pagedinfer.engine.server.auth import resolve_api_key

    monkeypatch.setenv("PAGEDINFER_API_KEY", "from-env")
    assert resolve_api_key(None) == "from-env"
    assert resolve_api_key("from-flag") == "from-flag"
    monkeypatch.setenv("PAGEDINFER_API_KEY", "")
    assert resolve_api_key(None) is None


def test_body_over_the_limit_is_a_413(keyed_server):
    big = completion(prompt="word " * 2000)
    r = httpx.post(keyed_server.url + "/v1/completions", json=big, headers=keyed_server.headers())
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert "4096" in r.json()["error"]["message"]


def test_chunked_body_over_the_limit_is_a_413(keyed_server):
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(100):
            yield b"x" * 100
        yield b'"}'

    r = httpx.post(keyed_server.url + "/v1/completions", content=chunks(),
                   headers={**keyed_server.headers(), "Content-Type": "application/json"})
    assert r.status_code == 413
    assert httpx.get(keyed_server.url + "/health").status_code == 200


def test_waiting_queue_over_the_limit_is_a_503_with_retry_after(tiny_llama):
    running = start_server(tiny_llama, max_waiting_requests=1, max_num_seqs=1)
    try:
        long = completion(max_tokens=200, ignore_eos=True, stream=True)
        results: list[int] = []

        def stream_one() -> None:
            with httpx.stream("POST", running.url + "/v1/completions", json=long, timeout=60) as r:
                results.append(r.status_code)
                for _ in r.iter_lines():
                    pass

        threads = [threading.Thread(target=stream_one) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.2)
        deadline = time.monotonic() + 30
        while running.metrics().get("pagedinfer_num_requests_waiting", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        r = httpx.post(running.url + "/v1/completions", json=completion())
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_overloaded"
        for t in threads:
            t.join(60)
        assert results == [200, 200]
        assert running.wait_idle()["pagedinfer_kv_cache_used_blocks"] == 0
    finally:
        stop_server(running)


def test_health_is_503_until_the_engine_is_loaded(tiny_llama):
    from pagedinfer.engine import EngineConfig
    from pagedinfer.engine.server.app import ServerSettings, create_app
    from pagedinfer.engine.server.engine_loop import EngineLoop
    from pagedinfer.engine.server.launcher import engine_factory
    from pagedinfer.engine.server.metrics import ServerMetrics

    gate = threading.Event()
    load = engine_factory(EngineConfig(model=str(tiny_llama), device="cpu", max_model_len=128,
                                       num_gpu_blocks_override=16), "tiny")

    def gated_load():
        gate.wait(60)
        return load()

    metrics = ServerMetrics("tiny")
    loop = EngineLoop(gated_load, observer=metrics)
    running = serve_app(create_app(loop, metrics, ServerSettings()), loop)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(running.url + "/health")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert r.status_code == 503
        busy = httpx.post(running.url + "/v1/completions", json=completion())
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "model_loading"
        assert busy.headers["retry-after"] == "1"
        gate.set()
        wait_healthy(running)
        assert httpx.post(running.url + "/v1/completions", json=completion()).status_code == 200
    finally:
        gate.set()
        stop_server(running)
