"""The router against engines that die: a broken stream ends cleanly, a restarted engine comes back."""

from __future__ import annotations

import json

import httpx
import pytest
from engine_process import serve_process
from router_harness import route_of, start_router, wait_for

from pagedinfer.testing.server_process import free_port, wait_process_healthy


@pytest.mark.slow
def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_event_and_done_then_comes_back(tiny_llama, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve_process(tiny_llama, port, tmp_path / "engine.log")
    router = None
    try:
        wait_process_healthy(url, proc)
        router = start_router([url], tiny_llama)
        body = {"model": "tiny", "prompt": "Keep going", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200 and route_of(r)["engine"] == url
            lines = []
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                if len(lines) == 3:
                    proc.kill()
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: ") :])
        assert error["error"]["code"] == "upstream_broken"

        proc.wait(30)
        state = router.app.state.router
        wait_for(lambda: not state.engines[url].healthy, "the killed engine was never dropped")
        assert not state.engines[url].hashes
        proc = serve_process(tiny_llama, port, tmp_path / "engine.log")  # the same address, a fresh cache
        wait_process_healthy(url, proc)
        wait_for(
            lambda: state.engines[url].healthy and state.engines[url].kv_seq is None and state.engines[url].block_size,
            "the restarted engine never came back",
        )
        r = httpx.post(
            router.url + "/v1/completions",
            json={**body, "stream": False, "max_tokens": 2, "prompt": "word " * 60},
            timeout=60,
        )
        assert r.status_code == 200 and route_of(r)["engine"] == url
        wait_for(lambda: len(state.engines[url].hashes) >= 3, "the new engine's events never reached the router")
    finally:
        if router is not None:
            router.stop()
        proc.kill()
        proc.wait(30)


def test_when_every_engine_answers_503_the_router_answers_503_with_retry_after(tiny_llama):
    """Draining engines refuse new requests with 503 (and soon fail /health): whether the router still sees
    them healthy (it then tries both and passes the last 503 on) or has already dropped them, the client
    gets 503 with Retry-After."""
    from serving_harness import start_server, stop_server

    from pagedinfer.engine.kv_events.publisher import KVEventsConfig
    from pagedinfer.router.hold.queue import HoldSettings

    engines = [start_server(tiny_llama, kv_events=KVEventsConfig(port=0)) for _ in range(2)]
    # Once the router has dropped them (a loaded machine's health checks can be that quick), the request waits
    # in the hold queue for an engine until its deadline: 2 s here, not the default 60 s the client waits too.
    router = start_router([e.url for e in engines], tiny_llama, hold=HoldSettings(timeout_seconds=2.0))
    try:
        for e in engines:
            e.engine_loop.begin_drain(None)
        r = httpx.post(
            router.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1}, timeout=60
        )
        assert r.status_code == 503 and r.headers["retry-after"]
        assert route_of(r)["engine"] in {e.url for e in engines} | {"none"}
    finally:
        router.stop()
        for e in engines:
            stop_server(e)
