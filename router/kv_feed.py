"""Follow one engine's prefix cache: discovery, subscribe, snapshot, gap recovery.

`KVFeed(url)` needs only the engine's HTTP URL. `run()` (an asyncio task):
1. GET /kv_events for the ports and block size; subscribe (ZeroMQ SUB) to the
   PUB port on the URL's host, so no batch after the snapshot can be missed;
2. GET /kv_events/snapshot: the hashes exact at sequence S, the device pool's
   and the host tier's (`tier_hashes`; an engine without a tier has none);
3. apply every received batch numbered above S in order; a batch that skips
   numbers asks the replay socket for the missing ones; if the replay buffer
   no longer has them (or the engine restarted: its numbers went back), take a
   new snapshot.

4. heartbeats (an engine that sends them): one naming a batch above the
   feed's is a gap, as in 3; no message for one of the engine's intervals
   plus `STALE_SLACK_SECONDS` marks the feed stale (`on_stale(True)`: the router stops
   scoring its blocks) until a message arrives and the feed has caught up
   (`on_stale(False)`). The rules are `feed_sync.py`'s.

The feed owns nothing shared: it calls `on_update(hashes, seq)` with its new
state (the router's state owner applies it), and `on_discovery(url, info)`
once it has read GET /kv_events (the router's tokenizer follows the engines'
fingerprint from it). Torch-free; zmq and httpx only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from pagedinfer.contracts.kv_events.events import EventBatch, apply_event, decode_batch
from pagedinfer.contracts.kv_events.frames import END_OF_REPLAY_SEQ, HEARTBEAT_SEQ, seq_from_bytes, seq_to_bytes
from pagedinfer.contracts.kv_events.heartbeat import decode_heartbeat
from pagedinfer.router import feed_sync

logger = logging.getLogger("pagedinfer.router.kv_feed")

REPLAY_TIMEOUT_SECONDS = 2.0
HTTP_TIMEOUT_SECONDS = 5.0
IDLE_POLL_SECONDS = 1.0  # a feed with no silence deadline (no heartbeats, or already stale) wakes this often


@dataclass(frozen=True)
class Discovery:
    pub_endpoint: str
    replay_endpoint: str
    topic: bytes
    block_size: int
    tokenizer_sha256: str | None = None  # the engine's tokenizer's fingerprint (GET /kv_events/tokenizer)
    heartbeat_interval_seconds: float | None = None  # None: the engine sends no heartbeats (or predates them)


async def discover(client: httpx.AsyncClient, url: str) -> Discovery:
    """The engine's event endpoints; ValueError if it does not publish events."""
    body = (await client.get(url + "/kv_events", timeout=HTTP_TIMEOUT_SECONDS)).raise_for_status().json()
    if not body.get("enabled"):
        raise ValueError(f"{url} does not publish KV events (start it with --kv-events)")
    host = urlsplit(url).hostname
    sha256 = body.get("tokenizer_sha256")
    interval = body.get("heartbeat_interval_seconds")
    return Discovery(
        f"tcp://{host}:{body['pub_port']}",
        f"tcp://{host}:{body['replay_port']}",
        str(body.get("topic", "")).encode(),
        int(body["block_size"]),
        sha256 if isinstance(sha256, str) else None,
        float(interval) if isinstance(interval, (int, float)) and interval > 0 else None,
    )


async def fetch_snapshot(client: httpx.AsyncClient, url: str) -> tuple[int | None, set[bytes], str | None, set[bytes]]:
    """(sequence, hashes, epoch, tier hashes); epoch None from an engine that predates heartbeats; the tier's
    hashes (medium CPU) empty from one without a tier."""
    body = (await client.get(url + "/kv_events/snapshot", timeout=HTTP_TIMEOUT_SECONDS)).raise_for_status().json()
    epoch = body.get("epoch")
    return (
        body["sequence"],
        {bytes.fromhex(h) for h in body["block_hashes"]},
        epoch if isinstance(epoch, str) else None,
        {bytes.fromhex(h) for h in body.get("cpu_block_hashes", ())},
    )


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
    except TimeoutError:
        return None
    finally:
        sock.close()


class KVFeed:
    def __init__(
        self,
        url: str,
        on_update: Callable[[set[bytes], int | None, int], None],
        client: httpx.AsyncClient,
        on_discovery: Callable[[str, Discovery], Awaitable[None]] | None = None,
        on_stale: Callable[[bool], None] | None = None,
    ) -> None:
        self.url = url
        self.on_update = on_update  # (hashes, seq, block_size); hashes is the feed's own set: copy to keep
        self.client = client
        self.on_discovery = on_discovery
        self.on_stale = on_stale  # (stale): True when the publisher went silent, False once caught up again
        self.hashes: set[bytes] = set()
        self.tier_hashes: set[bytes] = set()  # blocks in the engine's host tier (medium CPU); read with hashes
        self.seq: int | None = None
        self.epoch: str | None = None  # of the snapshot the state came from
        self.stale = False
        self.num_snapshots = 0
        self.num_replays = 0
        self.num_heartbeats = 0
        self.num_silences = 0  # times the feed was marked stale
        self.liveness = feed_sync.Liveness(None, time.monotonic())

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
            self.liveness = feed_sync.Liveness(info.heartbeat_interval_seconds, time.monotonic())
            while True:
                wait = None if self.stale else self.liveness.seconds_until_silent(time.monotonic())
                wait_ms = math.ceil((IDLE_POLL_SECONDS if wait is None else wait) * 1000)  # wake at the deadline
                if not await sub.poll(wait_ms):
                    self._check_silence()
                    continue
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = seq_from_bytes(frames[1])
                if seq == HEARTBEAT_SEQ:
                    await self._heartbeat(frames[2], info, ctx)
                else:
                    self.liveness.heard(time.monotonic())
                    await self._receive(decode_batch(seq, frames[2]), info, ctx)
                    self._caught_up()
        finally:
            sub.close()

    def _check_silence(self) -> None:
        if not self.stale and self.liveness.is_silent(time.monotonic()):
            self.stale = True
            self.num_silences += 1
            logger.warning(
                "KV events of %s silent for over %.2f s: its cache is not scored until they resume",
                self.url,
                self.liveness.quiet_limit_seconds,
            )
            if self.on_stale is not None:
                self.on_stale(True)

    def _caught_up(self) -> None:
        """Called once the feed has applied everything the message it just read announced."""
        if self.stale:
            self.stale = False
            logger.info("KV events of %s resumed; the router's view of it is current again", self.url)
            if self.on_stale is not None:
                self.on_stale(False)

    async def _heartbeat(self, payload: bytes, info: Discovery, ctx) -> None:
        try:
            beat = decode_heartbeat(payload)
        except ValueError as exc:
            logger.warning("KV events of %s: %s", self.url, exc)
            return
        self.num_heartbeats += 1
        self.liveness.heard(time.monotonic(), beat.interval_seconds)
        step = feed_sync.on_heartbeat(self.seq, self.epoch, beat)
        if step == "restart":
            await self._resnapshot(info)
        elif step == "gap":
            await self._catch_up(beat.last_seq, info, ctx)
            self.on_update(self.hashes, self.seq, info.block_size)
        self._caught_up()

    async def _resnapshot(self, info: Discovery) -> None:
        self.seq, self.hashes, self.epoch, self.tier_hashes = await fetch_snapshot(self.client, self.url)
        self.num_snapshots += 1
        self.on_update(self.hashes, self.seq, info.block_size)

    async def _catch_up(self, last_seq: int, info: Discovery, ctx) -> None:
        """Reflect every batch up to last_seq: from the replay buffer if it has them all, else a snapshot."""
        first = feed_sync.expected_seq(self.seq)
        self.num_replays += 1
        missing = await replay(ctx, info.replay_endpoint, first)
        wanted = [b for b in missing or () if b.seq <= last_seq]
        if feed_sync.is_contiguous([b.seq for b in wanted], first, last_seq):
            for b in wanted:
                self._apply(b)
        else:
            await self._resnapshot(info)

    async def _receive(self, batch: EventBatch, info: Discovery, ctx) -> None:
        step = feed_sync.on_batch(self.seq, batch.seq)
        if step == "restart":
            await self._resnapshot(info)
            return
        if step == "old":
            return  # already reflected in the snapshot
        if step == "gap":
            await self._catch_up(batch.seq - 1, info, ctx)
            if feed_sync.on_batch(self.seq, batch.seq) != "apply":
                return  # the snapshot already has it (its on_update told the state), or it is still ahead
        self._apply(batch)
        self.on_update(self.hashes, self.seq, info.block_size)

    def _apply(self, batch: EventBatch) -> None:
        for event in batch.events:
            apply_event(self.hashes, event, self.tier_hashes)
        self.seq = batch.seq
