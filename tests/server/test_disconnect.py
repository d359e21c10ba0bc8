"""A client that goes away aborts its request at once, streaming or not, and its blocks come back."""

from __future__ import annotations

import json
import time

import httpx
import pytest

LONG = {"model": "tiny", "prompt": "Tell me everything", "max_tokens": 240, "ignore_eos": True, "temperature": 0}


def _aborts(server) -> float:
    return server.metrics().get('pagedinfer_request_success_total{finished_reason="abort"}', 0.0)


def _wait_running(server, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while server.metrics().get("pagedinfer_num_requests_running", 0) < 1:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.01)


def test_non_streaming_client_that_hangs_up_aborts_its_request(server):
    before = _aborts(server)
    with pytest.raises(httpx.ReadTimeout):
        # The client gives up long before 240 tokens are generated and closes the connection.
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=httpx.Timeout(30, read=0.1))
    metrics = server.wait_idle()
    assert _aborts(server) == before + 1
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0
    assert metrics["pagedinfer_kv_cache_free_blocks"] == metrics["pagedinfer_kv_cache_num_blocks"]


def test_streaming_client_that_hangs_up_aborts_its_request(server):
    before = _aborts(server)
    generated_before = server.metrics()["pagedinfer_generation_tokens_total"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                _wait_running(server)
                break
    metrics = server.wait_idle()
    assert _aborts(server) == before + 1
    assert metrics["pagedinfer_generation_tokens_total"] - generated_before < LONG["max_tokens"]
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0
