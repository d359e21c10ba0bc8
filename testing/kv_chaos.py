"""Faults on an engine's KV-event stream, injected on the network: for tests and `bench/chaos.py` only.

`KVChaosProxy(engine_url, proxy_host)` stands in front of one running
`serve --kv-events` engine at another loopback address, with the SAME port
numbers, so that nothing needs rewriting: the engine's GET /kv_events (passed
through byte for byte) names ports that the proxy also holds on its own host,
and a router given the proxy's URL subscribes to the proxy. It carries:

- the HTTP port and the replay port: plain TCP relays, byte for byte;
- the PUB port: a ZeroMQ SUB on the engine's publisher re-publishing each
  message on a PUB of its own, unless a fault takes it:
  `drop_fraction` drops that share of messages (batches and heartbeats alike;
  `random.Random(seed)` decides, so a run repeats), `silence()` drops every
  message until `resume()`, while HTTP (and replay) keep answering: a
  publisher that went quiet behind a healthy server.

Nothing in the engine or the router knows the proxy exists; the faults are
what a lossy network or a stuck publisher thread would do. The proxy runs
its own asyncio loop on a daemon thread; `stop()` closes everything.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from pagedinfer.contracts.kv_events.frames import HEARTBEAT_SEQ, seq_from_bytes

RELAY_CHUNK_BYTES = 1 << 16


@dataclass
class ChaosCounters:
    forwarded: int = 0  # PUB messages passed on
    dropped: int = 0  # taken by drop_fraction
    silenced: int = 0  # taken while silenced
    last_silenced_seq: int | None = None  # the sequence number of the last batch (not heartbeat) taken while silenced


class KVChaosProxy:
    def __init__(self, engine_url: str, proxy_host: str, drop_fraction: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= drop_fraction <= 1.0:
            raise ValueError(f"drop_fraction: must be within [0, 1], got {drop_fraction}")
        parts = urlsplit(engine_url)
        if parts.hostname == proxy_host:
            raise ValueError(f"proxy_host: must differ from the engine's host {parts.hostname} (same ports on both)")
        self.engine_host, self.http_port = parts.hostname, parts.port
        self.proxy_host = proxy_host
        self.drop_fraction = drop_fraction
        self.counters = ChaosCounters()
        self._random = random.Random(seed)
        self._silenced = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kv-chaos-proxy", daemon=True)
        info = httpx.get(engine_url + "/kv_events", timeout=10).raise_for_status().json()
        if not info.get("enabled"):
            raise ValueError(f"{engine_url} does not publish KV events (start it with --kv-events)")
        self.pub_port, self.replay_port = int(info["pub_port"]), int(info["replay_port"])

    @property
    def url(self) -> str:
        """The engine's URL as the router should know it."""
        return f"http://{self.proxy_host}:{self.http_port}"

    def start(self) -> KVChaosProxy:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise ValueError(f"the KV chaos proxy cannot start on {self.proxy_host}: {self._error}")
        return self

    def silence(self) -> None:
        self._silenced = True

    def resume(self) -> None:
        self._silenced = False

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    # ----- the proxy's thread ------------------------------------------------------------
    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start(), which raises it
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        import zmq
        import zmq.asyncio

        self._stop = asyncio.Event()
        servers = [
            await asyncio.start_server(self._relay_to(port), self.proxy_host, port)
            for port in (self.http_port, self.replay_port)
        ]
        ctx = zmq.asyncio.Context()
        sub, pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
        for s in (sub, pub):
            s.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        pub.bind(f"tcp://{self.proxy_host}:{self.pub_port}")
        sub.connect(f"tcp://{self.engine_host}:{self.pub_port}")
        self._ready.set()
        forward = asyncio.ensure_future(self._forward(sub, pub))
        try:
            await self._stop.wait()
        finally:
            forward.cancel()
            await asyncio.gather(forward, return_exceptions=True)
            for server in servers:
                server.close()
            sub.close()
            pub.close()
            ctx.term()

    async def _forward(self, sub, pub) -> None:
        while True:
            frames = await sub.recv_multipart()
            if self._silenced:
                self.counters.silenced += 1
                if len(frames) == 3 and (seq := seq_from_bytes(frames[1])) != HEARTBEAT_SEQ:
                    self.counters.last_silenced_seq = seq
            elif self.drop_fraction and self._random.random() < self.drop_fraction:
                self.counters.dropped += 1
            else:
                await pub.send_multipart(frames)
                self.counters.forwarded += 1

    def _relay_to(self, port: int):
        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(self.engine_host, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)

        return relay


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(RELAY_CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
