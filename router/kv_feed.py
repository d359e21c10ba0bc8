"""Follow one engine's prefix cache: discovery, subscribe, snapshot, gap recovery.

`KVFeed(url)` needs only the engine's HTTP URL. `run()` (an asyncio task):
1. GET /kv_events for the ports and block size; subscribe (ZeroMQ SUB) to the
   PUB port on the URL's host, so no batch after the snapshot can be missed;
2. GET /kv_events/snapshot: the hashes exact at sequence S;
3. apply every received batch numbered above S in order; a batch that skips
   numbers asks the replay socket for the missing ones; if the replay buffer
   no longer has them (or the engine restarted: its numbers went back), take a
   new snapshot.

The feed owns nothing shared: it calls `on_update(hashes, seq)` with its new
state (the router's state owner applies it), and `on_discovery(url, info)`
once it has read GET /kv_events (the router's tokenizer follows the engines'
fingerprint from it). Torch-free; zmq and httpx only.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable
from urllib.parse import urlsplit

import httpx

from pagedinfer.engine.kv_events.events import (END_OF_REPLAY_SEQ, EventBatch, apply_event, decode_batch,
                                                seq_from_bytes, seq_to_bytes)

logger = logging.getLogger("pagedinfer.router.kv_feed")

REPLAY_TIMEOUT_SECONDS = 2.0
HTTP_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Discovery:
    pub_endpoint: str
    replay_endpoint: str
    topic: bytes
    block_size: int
    tokenizer_sha256: str | None = None  # the engine's tokenizer's fingerprint (GET /kv_events/tokenizer)


async def discover(client: httpx.AsyncClient, url: str) -> Discovery:
    """The engine's event endpoints; ValueError if it does not publish events."""
    body = (await client.get(url + "/kv_events", timeout=HTTP_TIMEOUT_SECONDS)).raise_for_status().json()
    if not body.get("enabled"):
        raise ValueError(f"{url} does not publish KV events (start it with --kv-events)")
    host = urlsplit(url).hostname
    sha256 = body.get("tokenizer_sha256")
    return Discovery(f"tcp://{host}:{body['pub_port']}", f"tcp://{host}:{body['replay_port']}",
                     str(body.get("topic", "")).encode(), int(body["block_size"]),
                     sha256 if isinstance(sha256, str) else None)


async def fetch_snapshot(client: httpx.AsyncClient, url: str) -> tuple[int | None, set[bytes]]:
    body = (await client.get(url + "/kv_events/snapshot", timeout=HTTP_TIMEOUT_SECONDS)).raise_for_status().json()
    return body["sequence"], {bytes.fromhex(h) for h in body["block_hashes"]}


async def replay(ctx, endpoint: str, start_seq: int) -> list[EventBatch] | None:
    """Batches from start_seq on, from the engine's replay buffer; None if it does not answer in time."""
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        await sock.send_multipart([b"", seq_to_bytes(start_seq)])
        batches = []
        while True:
            frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_SECONDS)
            seq = seq_from_bytes(frames[-2])
            if seq == END_OF_REPLAY_SEQ:
                return batches
            batches.append(decode_batch(seq, frames[-1]))
    except asyncio.TimeoutError:
        return None
    finally:
        sock.close()


class KVFeed:
    def __init__(self, url: str, on_update: Callable[[set[bytes], int | None, int], None],
                 client: httpx.AsyncClient,
                 on_discovery: Callable[[str, Discovery], Awaitable[None]] | None = None) -> None:
        self.url = url
        self.on_update = on_update  # (hashes, seq, block_size); hashes is the feed's own set: copy to keep
        self.client = client
        self.on_discovery = on_discovery
        self.hashes: set[bytes] = set()
        self.seq: int | None = None
        self.num_snapshots = 0
        self.num_replays = 0

    async def run(self) -> None:
        """Follow the engine until cancelled; errors propagate (the caller marks the engine lost)."""
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        info = await discover(self.client, self.url)
        if self.on_discovery is not None:
            await self.on_discovery(self.url, info)
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, info.topic)
        sub.connect(info.pub_endpoint)
        try:
            await asyncio.sleep(0.05)  # let the subscription reach the publisher before the snapshot
            await self._resnapshot(info)
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                batch = decode_batch(seq_from_bytes(frames[1]), frames[2])
                await self._receive(batch, info, ctx)
        finally:
            sub.close()

    async def _resnapshot(self, info: Discovery) -> None:
        self.seq, self.hashes = await fetch_snapshot(self.client, self.url)
        self.num_snapshots += 1
        self.on_update(self.hashes, self.seq, info.block_size)

    async def _receive(self, batch: EventBatch, info: Discovery, ctx) -> None:
        expected = 0 if self.seq is None else self.seq + 1
        if batch.seq < expected:
            if batch.seq == 0 and self.seq:
                await self._resnapshot(info)  # the engine restarted: its numbers began again
            return  # already reflected in the snapshot
        if batch.seq > expected:
            self.num_replays += 1
            missing = await replay(ctx, info.replay_endpoint, expected)
            if not missing or missing[0].seq != expected or any(
                    b.seq != expected + i for i, b in enumerate(missing)):
                await self._resnapshot(info)
                if batch.seq <= (self.seq if self.seq is not None else -1):
                    return
                if batch.seq != (0 if self.seq is None else self.seq + 1):
                    return  # still a gap: the next batch will resnapshot again
            else:
                for b in missing:
                    if b.seq < batch.seq:
                        self._apply(b)
        self._apply(batch)
        self.on_update(self.hashes, self.seq, info.block_size)

    def _apply(self, batch: EventBatch) -> None:
        for event in batch.events:
            apply_event(self.hashes, event)
        self.seq = batch.seq
