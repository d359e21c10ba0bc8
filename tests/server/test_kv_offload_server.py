"""A server with the prefix cache's host tier (`--kv-offloading-size`): a returning user's blocks come back from
the tier, usage.prompt_tokens_details.cached_tokens counts them, /metrics shows the tier, and a router's feed
knows which medium holds each block as they move (events of medium GPU and CPU, docs/kv-offload.md)."""

from __future__ import annotations

import asyncio

import httpx
from kv_feed_follow import follow_while
from serving_harness import start_server, stop_server

from pagedinfer.engine.kv_events.publisher import KVEventsConfig

USERS = [[(u * 37 + i) % 200 + 8 for i in range(70)] for u in range(3)]  # 4 full blocks of 16 each


async def _two_turns(client: httpx.AsyncClient) -> list[dict]:
    """Each user's first turn, then each returns with more (the usage of every answer)."""
    usages = []
    for turn in range(2):
        for user in USERS:  # 3 users x 5 blocks > the 8-block pool: each evicts the one before
            r = await client.post(
                "/v1/completions", json={"model": "tiny", "prompt": user + [9, 10, 11] * turn, "max_tokens": 2}
            )
            assert r.status_code == 200, r.text
            usages.append(r.json()["usage"])
    return usages


async def _router_view(url: str, snap: dict):
    """The router's own view of the engine (RouterState, as `pagedinfer router` runs it) once it is current."""
    from pagedinfer.router.state import RouterState

    async with httpx.AsyncClient() as client:
        state = RouterState([url], client)
        state.start()
        try:
            for _ in range(500):
                record = state.engines[url]
                if record.kv_seq is not None and record.kv_seq >= snap["sequence"]:
                    break
                await asyncio.sleep(0.02)
            return state.views()
        finally:
            await state.stop()


def test_tier_hits_are_cached_tokens_metrics_and_events_of_their_medium(tiny_llama):
    running = start_server(
        tiny_llama,
        kv_events=KVEventsConfig(port=0),
        num_gpu_blocks_override=8,
        max_model_len=128,
        kv_offloading_size=0.001,
    )
    try:
        feed, usages, snap = asyncio.run(follow_while(running.url, _two_turns))
        # every returning user found its 4 blocks, now in the tier: cached tokens say so
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages[3:]] == [64, 64, 64]
        # the feed, applying events of both media as blocks moved, knows where each block is (the snapshot)
        assert feed.hashes == {bytes.fromhex(h) for h in snap["block_hashes"]}
        assert feed.tier_hashes == {bytes.fromhex(h) for h in snap["cpu_block_hashes"]}
        assert feed.tier_hashes and not feed.hashes & feed.tier_hashes
        (view,) = asyncio.run(_router_view(running.url, snap))  # what the router's prefix policy scores
        assert (set(view.cached_hashes), set(view.tier_hashes)) == (feed.hashes, feed.tier_hashes)
        m = running.wait_idle()
        assert m["pagedinfer_prefix_cache_offload_hits_total"] == 3 * 64
        assert m["pagedinfer_prefix_cache_hits_total"] >= 3 * 64
        assert m['pagedinfer_kv_offload_bytes_total{direction="host_to_device"}'] > 0
        assert m['pagedinfer_kv_offload_bytes_total{direction="device_to_host"}'] > 0
        assert m['pagedinfer_kv_offload_copy_seconds_total{direction="host_to_device"}'] > 0
        assert m["pagedinfer_kv_offload_cached_blocks"] == len(feed.tier_hashes)
        assert 0 < m["pagedinfer_kv_offload_usage_ratio"] <= 1
    finally:
        stop_server(running)
