"""Load: 200 concurrent streaming clients, a quarter of them hanging up mid-stream.

The others must complete correctly, every KV block must come back, and the
server's counters must agree with what the clients saw.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from serving_harness import start_server, stop_server

NUM_CLIENTS = 200
OUTPUT_TOKENS = 8
DISCONNECTING_OUTPUT_TOKENS = 200  # long, so the hang-up lands while the request still runs


@pytest.fixture(scope="module")
def load_server(tiny_llama):
    # A pool smaller than the load needs: requests queue, and the scheduler preempts.
    running = start_server(tiny_llama, num_gpu_blocks_override=48, max_num_seqs=64, max_model_len=256)
    yield running
    stop_server(running)


async def _client(http: httpx.AsyncClient, url: str, i: int, disconnect: bool) -> dict:
    body = {
        "model": "tiny",
        "prompt": f"Client {i} says hello to the server and",
        "temperature": 0,
        "max_tokens": DISCONNECTING_OUTPUT_TOKENS if disconnect else OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = {"tokens_chunks": 0, "finish": None, "usage": None, "status": None, "done": False}
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        result["status"] = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                result["done"] = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                result["usage"] = chunk["usage"]
            for choice in chunk["choices"]:
                result["tokens_chunks"] += 1
                if choice["finish_reason"]:
                    result["finish"] = choice["finish_reason"]
            if disconnect and result["tokens_chunks"] >= 2:
                break  # leaving the block closes the connection mid-stream
    return result


async def _run_load(url: str) -> list[tuple[bool, dict]]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        plan = [(i % 4 == 0) for i in range(NUM_CLIENTS)]
        results = await asyncio.gather(*[_client(http, url, i, d) for i, d in enumerate(plan)])
    return list(zip(plan, results))


@pytest.mark.slow
def test_concurrent_streams_with_hangups_complete_and_free_every_block(load_server):
    before = load_server.metrics()
    outcomes = asyncio.run(_run_load(load_server.url))
    after = load_server.wait_idle(timeout_seconds=60)

    completed = [r for disconnect, r in outcomes if not disconnect]
    hung_up = [r for disconnect, r in outcomes if disconnect]
    assert len(completed) == 150 and len(hung_up) == 50
    for r in completed:
        assert r["status"] == 200 and r["done"] and r["finish"] == "length"
        assert r["usage"]["completion_tokens"] == OUTPUT_TOKENS
    assert all(r["status"] == 200 and not r["done"] for r in hung_up)

    assert after["pagedinfer_kv_cache_free_blocks"] == after["pagedinfer_kv_cache_num_blocks"]
    assert after["pagedinfer_kv_cache_used_blocks"] == 0
    assert after["pagedinfer_num_requests_running"] == 0 and after["pagedinfer_num_requests_waiting"] == 0

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    lengths = delta('pagedinfer_request_success_total{finished_reason="length"}')
    aborts = delta('pagedinfer_request_success_total{finished_reason="abort"}')
    assert lengths + aborts == NUM_CLIENTS
    assert aborts == len(hung_up)  # every hang-up aborted a running request
    generated_seen = sum(r["usage"]["completion_tokens"] for r in completed)
    generated = delta("pagedinfer_generation_tokens_total")
    assert generated_seen <= generated <= generated_seen + len(hung_up) * DISCONNECTING_OUTPUT_TOKENS
    prompt_seen = sum(r["usage"]["prompt_tokens"] for r in completed)
    assert delta("pagedinfer_prompt_tokens_total") >= prompt_seen
    assert delta("pagedinfer_time_to_first_token_seconds_count") == NUM_CLIENTS
    assert delta("pagedinfer_e2e_request_latency_seconds_count") == len(completed)
    assert httpx.get(load_server.url + "/health").status_code == 200
