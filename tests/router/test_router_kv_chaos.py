"""The router's index under faults of the KV-event stream: a silenced publisher, a lost last batch, eviction.

One real engine process (a small pool, heartbeats every 0.5 s, the default) behind a ZeroMQ/TCP proxy
(`pagedinfer.testing.kv_chaos`) that can silence its publisher while HTTP keeps answering, and the real
router app following the proxy's address. Requests go one at a time, so the engine's own answer
(`usage.prompt_tokens_details.cached_tokens`) says whether a routed hit was real.
"""

from __future__ import annotations

import httpx
import pytest
from engine_process import serve_process
from router_harness import route_of, start_router, wait_for

from pagedinfer.router.hashing import prefix_block_hashes
from pagedinfer.testing.kv_chaos import KVChaosProxy
from pagedinfer.testing.server_process import free_port, wait_process_healthy

ENGINE_HOST, PROXY_HOST = "127.0.0.2", "127.0.0.12"
BLOCK = 16
NUM_BLOCKS = 24  # 384 tokens: eight 80-token prompts evict the first


def _prompt(k: int) -> list[int]:
    return [(7 * i + 13 * k) % 300 + 3 for i in range(80)]  # 5 full blocks, distinct per k from the first


def _ask(url: str, prompt: list[int]) -> tuple[dict[str, str], int]:
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1}, timeout=60)
    assert r.status_code == 200, r.text
    return route_of(r), r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _snapshot(url: str) -> tuple[int, set[bytes]]:
    body = httpx.get(url + "/kv_events/snapshot", timeout=10).json()
    return body["sequence"], {bytes.fromhex(h) for h in body["block_hashes"]}


@pytest.fixture
def engine_behind_proxy(tiny_llama, tmp_path):
    port = free_port()
    url = f"http://{ENGINE_HOST}:{port}"
    proc = serve_process(
        tiny_llama,
        port,
        tmp_path / "engine.log",
        host=ENGINE_HOST,
        extra_args=("--num-gpu-blocks-override", str(NUM_BLOCKS), "--max-model-len", "256"),
    )
    proxy = None
    try:
        wait_process_healthy(url, proc, log_path=tmp_path / "engine.log")
        proxy = KVChaosProxy(url, PROXY_HOST).start()
        yield url, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        proc.kill()
        proc.wait(30)


def test_a_silenced_publisher_stops_being_scored_and_a_heartbeat_brings_back_what_it_missed(
    engine_behind_proxy, tiny_llama
):
    engine_url, proxy = engine_behind_proxy
    router = start_router([proxy.url], tiny_llama)
    try:
        record = router.app.state.router.engines[proxy.url]
        first = _prompt(0)
        _ask(router.url, first)
        wait_for(lambda: set(prefix_block_hashes(first, BLOCK)) <= record.hashes, "the stored blocks never arrived")
        route, cached = _ask(router.url, first)
        assert route["reason"] == "prefix-hit" and int(route["matched_tokens"]) == 80 and cached >= 64

        proxy.silence()  # HTTP still answers; no batch and no heartbeat reaches the router
        wait_for(lambda: record.kv_stale, "the router never noticed the silent publisher")
        assert record.healthy and record.view().cached_hashes == frozenset()
        route, _ = _ask(router.url, first)  # its blocks ARE cached, but the router no longer vouches for them
        assert route["engine"] == proxy.url and route["matched_tokens"] == "0" and route["reason"] != "prefix-hit"
        second = _prompt(1)
        _ask(router.url, second)  # stored while silenced: the router does not see it
        published, _ = _snapshot(engine_url)
        wait_for(
            lambda: (proxy.counters.last_silenced_seq or -1) >= published,
            "the engine's batch never reached the silenced proxy",
        )
        assert not set(prefix_block_hashes(second, BLOCK)) & record.hashes

        proxy.resume()  # no batch follows: only a heartbeat can say that one was missed
        wait_for(lambda: not record.kv_stale, "the router never took the engine's events back")
        wait_for(
            lambda: set(prefix_block_hashes(second, BLOCK)) <= record.hashes,
            "the heartbeat did not bring back the batch sent during the silence",
        )
        assert proxy.counters.silenced >= 2  # the silence took at least the batch and a heartbeat
        route, cached = _ask(router.url, second)
        assert route["reason"] == "prefix-hit" and cached >= 64

        for k in range(2, 10):  # eviction: eight more prompts do not fit beside the first two
            route, cached = _ask(router.url, _prompt(k))
            assert int(route["matched_tokens"]) <= cached  # never a phantom hit
        sequence, engine_hashes = _snapshot(engine_url)
        wait_for(lambda: record.kv_seq is not None and record.kv_seq >= sequence, "the router fell behind")
        assert record.hashes == engine_hashes  # every BlockRemoved was followed
        assert not set(prefix_block_hashes(first, BLOCK)) & record.hashes  # the first prompt was evicted
        route, cached = _ask(router.url, first)
        assert route["matched_tokens"] == "0" and cached == 0
    finally:
        router.stop()
