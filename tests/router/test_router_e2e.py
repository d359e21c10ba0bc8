"""`pagedinfer router` in front of real engines: prefix routing from their KV events, streaming, faults."""

from __future__ import annotations

import httpx
import openai
from router_harness import route_of, start_router, wait_for
from serving_harness import start_server, stop_server

from pagedinfer.engine.kv_events.publisher import KVEventsConfig
from pagedinfer.router.hold.queue import HoldSettings

SYSTEM = "You are a careful assistant for tenant number seven. " * 6


def _chat(url: str, turns: list[str], stream: bool = False) -> httpx.Response:
    messages = [{"role": "system", "content": SYSTEM}] + [{"role": "user", "content": t} for t in turns]
    return httpx.post(
        url + "/v1/chat/completions",
        timeout=60,
        json={"model": "tiny", "messages": messages, "max_tokens": 4, "stream": stream},
    )


def test_a_conversations_next_turn_goes_to_the_engine_that_holds_its_prefix(router):
    first = _chat(router.url, ["hello"])
    assert first.status_code == 200, first.text
    home = route_of(first)["engine"]
    state = router.app.state.router
    wait_for(lambda: len(state.engines[home].hashes) > 0, "the engine's stored blocks never reached the router")
    second = _chat(router.url, ["hello", "and more"])
    route = route_of(second)
    assert route["engine"] == home and route["reason"] == "prefix-hit" and int(route["matched_tokens"]) >= 32
    metrics = httpx.get(router.url + "/metrics").text
    assert f'pagedinfer_router_decisions_total{{engine="{home}",reason="prefix-hit"}}' in metrics


def test_the_openai_client_streams_through_the_router_and_sees_the_route_header(router):
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    raw = client.completions.with_raw_response.create(model="tiny", prompt="Once upon", max_tokens=5, stream=True)
    assert "engine=" in raw.headers["x-pagedinfer-route"]
    chunks = list(raw.parse())
    assert chunks and chunks[-1].choices[0].finish_reason == "length"
    assert client.models.list().data[0].id == "tiny"


def test_a_dead_engine_is_dropped_its_request_retried_and_with_none_left_the_request_is_held_then_503(tiny_llama):
    engines = [start_server(tiny_llama, kv_events=KVEventsConfig(port=0)) for _ in range(2)]
    router = start_router(
        [e.url for e in engines], tiny_llama, policy="round-robin", hold=HoldSettings(timeout_seconds=0.5)
    )
    try:
        stop_server(engines[0])
        state = router.app.state.router
        for _ in range(4):  # round-robin meets the dead engine: a refused connection is retried elsewhere
            r = _chat(router.url, ["hi"])
            assert r.status_code == 200, r.text
            assert route_of(r)["engine"] == engines[1].url
        assert not state.engines[engines[0].url].healthy and not state.engines[engines[0].url].hashes
        stop_server(engines[1])
        wait_for(lambda: not state.views(), "the router still routes to a stopped engine")
        r = _chat(router.url, ["hi"])  # held for an engine, none comes: 503 at its deadline
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert route_of(r)["reason"] == "no-engine" and "no engine became ready" in r.json()["error"]["message"]
        assert httpx.get(router.url + "/health").json()["status"] == "holding"  # it still takes requests
    finally:
        router.stop()


def test_bad_bodies_are_refused_by_the_router_itself(router):
    r = httpx.post(router.url + "/v1/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 400 and route_of(r)["reason"] == "invalid-request"
    r = httpx.post(
        router.url + "/v1/completions", content=b"x" * ((1 << 20) + 1), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413


def test_an_api_key_is_required_on_v1_and_passed_on(engines, tiny_llama):
    router = start_router([e.url for e in engines], tiny_llama, api_key="sesame")
    try:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        assert httpx.post(router.url + "/v1/completions", json=body, timeout=60).status_code == 401
        ok = httpx.post(
            router.url + "/v1/completions", json=body, timeout=60, headers={"Authorization": "Bearer sesame"}
        )
        assert ok.status_code == 200
        assert httpx.get(router.url + "/health").status_code == 200  # probes need no key
    finally:
        router.stop()
