"""An asleep engine says so and refuses completions; a request held at the router wakes it and is answered as
before the sleep."""

from __future__ import annotations

import httpx
from router_harness import route_of, start_router, wait_for
from serving_harness import start_server, stop_server

from pagedinfer.engine.kv_events.publisher import KVEventsConfig
from pagedinfer.router.hold.queue import HoldSettings

KEY = {"Authorization": "Bearer sesame"}
BODY = {
    "model": "tiny",
    "prompt": "The quick brown fox jumps over the lazy dog " * 3,
    "max_tokens": 6,
    "temperature": 0.0,
}


def test_the_router_wakes_an_asleep_engine_for_a_held_request_and_greedy_output_is_unchanged(tiny_llama):
    engine = start_server(tiny_llama, api_key="sesame", kv_events=KVEventsConfig(port=0))
    router = start_router([engine.url], tiny_llama, api_key="sesame", hold=HoldSettings(120.0, 8, 0.2))
    try:
        state = router.app.state.router.engines[engine.url]
        before = httpx.post(router.url + "/v1/completions", json=BODY, headers=KEY, timeout=60)
        assert before.status_code == 200, before.text
        wait_for(lambda: state.hashes, "the engine's cache never reached the router")

        assert httpx.post(engine.url + "/sleep").status_code == 401  # an admin route: behind the API key
        assert httpx.post(engine.url + "/sleep", params={"level": 2}, headers=KEY).json()["error"]["param"] == "level"
        slept = httpx.post(engine.url + "/sleep", headers=KEY, timeout=60)
        assert slept.status_code == 200 and slept.json()["is_sleeping"] and slept.json()["kv_bytes"] > 0
        assert httpx.get(engine.url + "/health").json() == {"status": "asleep"}
        assert httpx.get(engine.url + "/is_sleeping", headers=KEY).json() == {"is_sleeping": True}
        assert 'pagedinfer_engine_sleeping{model_name="tiny"} 1.0' in httpx.get(engine.url + "/metrics").text
        refused = httpx.post(engine.url + "/v1/completions", json={**BODY, "stream": True}, headers=KEY, timeout=60)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "asleep"
        wait_for(lambda: state.asleep and not state.hashes, "the router never saw the engine asleep and emptied")

        after = httpx.post(router.url + "/v1/completions", json=BODY, headers=KEY, timeout=60)
        assert after.status_code == 200 and route_of(after)["engine"] == engine.url
        assert after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
        assert not state.asleep
        assert httpx.get(engine.url + "/is_sleeping", headers=KEY).json() == {"is_sleeping": False}
        assert 'pagedinfer_engine_sleeping{model_name="tiny"} 0.0' in httpx.get(engine.url + "/metrics").text
    finally:
        router.stop()
        stop_server(engine)
