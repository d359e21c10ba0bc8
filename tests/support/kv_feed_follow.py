"""Follow a server's KV events with a real KVFeed while requests run, until the feed reflects the snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx

from pagedinfer.router.kv_feed import KVFeed

T = TypeVar("T")


async def follow_while(url: str, send: Callable[[httpx.AsyncClient], Awaitable[T]]) -> tuple[KVFeed, T, dict]:
    """(feed, what send returned, the snapshot taken after it): the feed has applied every batch up to the
    snapshot's sequence (or waited 10 s for it; the caller's comparison then says what differs)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        feed = KVFeed(url, lambda hashes, seq, block_size: None, client)
        task = asyncio.create_task(feed.run())
        while feed.num_snapshots == 0:
            await asyncio.sleep(0.02)
        result = await send(client)
        snap = (await client.get(url + "/kv_events/snapshot")).json()
        for _ in range(500):
            if feed.seq is not None and feed.seq >= snap["sequence"]:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return feed, result, snap
