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


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": KEY},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY}x"},
    ],
    ids=["missing", "wrong", "no-scheme", "basic", "longer"],
)
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


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_the_api_description_needs_the_key(keyed_server, path):
    refused = httpx.get(keyed_server.url + path)
    assert refused.status_code == 401, refused.text[:200]
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(keyed_server.url + path, headers=keyed_server.headers()).status_code == 200


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
    from pagedinfer.contracts.http.auth import resolve_api_key

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

    r = httpx.post(
        keyed_server.url + "/v1/completions",
        content=chunks(),
        headers={**keyed_server.headers(), "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert httpx.get(keyed_server.url + "/health").status_code == 200


def _wait_for(running, name: str, value: float, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while running.metrics().get(name, 0) < value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)


def test_waiting_limit_counts_every_prompt_times_n(tiny_llama):
    """Limit 3, two sequences at a time: a long n=2 stream runs, a 2-prompt stream waits (2 of 3 used)."""
    running = start_server(tiny_llama, max_waiting_requests=3, max_num_seqs=2, max_model_len=1024)
    hang_up = threading.Event()
    statuses: list[int] = []

    def hold_stream(body: dict) -> None:
        with httpx.stream("POST", running.url + "/v1/completions", json=body, timeout=60) as r:
            statuses.append(r.status_code)
            hang_up.wait(60)

    def post(**fields) -> httpx.Response:
        return httpx.post(running.url + "/v1/completions", json=completion(**fields), timeout=30)

    long = dict(max_tokens=1000, ignore_eos=True, stream=True)
    holders = [
        threading.Thread(target=hold_stream, args=(completion(n=2, **long),)),
        threading.Thread(target=hold_stream, args=(completion(prompt=["a", "b"], **long),)),
    ]
    try:
        holders[0].start()
        _wait_for(running, "pagedinfer_num_requests_running", 1)  # one request: its n=2 hold both seats
        holders[1].start()
        _wait_for(running, "pagedinfer_num_requests_waiting", 2)

        two_more = post(prompt=["c", "d"])
        assert two_more.status_code == 503, two_more.text  # 2 waiting + 2 > 3, though 2 < 3
        assert two_more.headers["retry-after"] == "1"
        assert two_more.json()["error"]["code"] == "server_overloaded"
        assert two_more.json()["error"]["type"] == "server_overloaded"

        too_many_prompts = post(prompt=["c", "d", "e", "f"])
        assert too_many_prompts.status_code == 400  # alone over the limit: retrying cannot help
        assert too_many_prompts.json()["error"]["param"] == "prompt"
        too_large_n = post(prompt=["c", "d"], n=2)  # 2 prompts fit, 2 x 2 do not
        assert too_large_n.status_code == 400
        assert too_large_n.json()["error"]["param"] == "n"
        assert "limit of 3" in too_large_n.json()["error"]["message"]
    finally:
        hang_up.set()
        for t in holders:
            t.join(60)
    try:
        assert statuses == [200, 200]
        assert running.wait_idle()["pagedinfer_kv_cache_used_blocks"] == 0
    finally:
        stop_server(running)


def test_a_burst_of_concurrent_requests_admits_exactly_the_free_waiting_slots(tiny_llama):
    """Limit 4, one sequence running: of 10 simultaneous chat streams exactly 4 are queued, 6 get 503."""
    running = start_server(tiny_llama, max_waiting_requests=4, max_num_seqs=1, max_model_len=1024)
    hang_up = threading.Event()
    statuses: list[int] = []
    lock = threading.Lock()
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }

    def hold_chat() -> None:
        with httpx.stream("POST", running.url + "/v1/chat/completions", json=chat, timeout=60) as r:
            with lock:
                statuses.append(r.status_code)  # chat streams send their role chunk (and headers) on admission
            hang_up.wait(60)

    first = threading.Thread(target=hold_chat)
    burst = [threading.Thread(target=hold_chat) for _ in range(10)]
    try:
        first.start()
        _wait_for(running, "pagedinfer_num_requests_running", 1)
        for t in burst:
            t.start()
        deadline = time.monotonic() + 30
        while len(statuses) < 11 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(statuses) == [200] * 5 + [503] * 6
    finally:
        hang_up.set()
        for t in [first, *burst]:
            t.join(60)
    try:
        assert running.wait_idle()["pagedinfer_kv_cache_used_blocks"] == 0
    finally:
        stop_server(running)


def test_health_is_503_until_the_engine_is_loaded(tiny_llama):
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine.server.app import ServerSettings, create_app
    from pagedinfer.engine.server.engine_loop import EngineLoop
    from pagedinfer.engine.server.launcher import engine_factory
    from pagedinfer.engine.server.metrics import ServerMetrics

    gate = threading.Event()
    load = engine_factory(
        EngineConfig(model=str(tiny_llama), device="cpu", max_model_len=128, num_gpu_blocks_override=16), "tiny"
    )

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
        assert busy.json()["error"]["type"] == "service_unavailable_error"
        assert busy.headers["retry-after"] == "1"
        series = running.metrics()  # no request has finished: every request series is there already, at 0
        for reason in ("stop", "length", "abort"):
            assert series[f'pagedinfer_request_success_total{{finished_reason="{reason}"}}'] == 0
        for name in ("time_to_first_token", "inter_token_latency", "e2e_request_latency", "request_queue_time"):
            assert series[f"pagedinfer_{name}_seconds_count"] == 0
        gate.set()
        wait_healthy(running)
        assert httpx.post(running.url + "/v1/completions", json=completion()).status_code == 200
    finally:
        gate.set()
        stop_server(running)


def test_bench_serve_without_the_key_names_api_key(keyed_server, monkeypatch):
    from pagedinfer.engine.cli import build_parser

    monkeypatch.delenv("PAGEDINFER_API_KEY", raising=False)
    args = build_parser().parse_args(
        ["bench", "serve", "--url", keyed_server.url, "--num-prompts", "1", "--no-progress"]
    )
    with pytest.raises(ValueError, match="--api-key") as refused:
        args.func(args)
    assert KEY not in str(refused.value)
