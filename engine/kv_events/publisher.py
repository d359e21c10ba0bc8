"""The ZeroMQ publisher of KV-cache events: never blocks the engine.

The engine thread only calls `record(event)` (through the block pool's
event sink): under a lock held for O(1) work it updates the mirror (the set of
cached block hashes) and appends to a bounded pending list. One thread of the
publisher's own owns both sockets: every `FLUSH_INTERVAL_SECONDS` it seals the
pending events into a batch with the next sequence number, sends it on the
PUB socket and keeps it in the replay buffer; between flushes it answers
replay requests on the ROUTER socket.

Invariants:
- sequence numbers start at 0 and grow by one per batch, except that a batch
  after pending events were dropped (the engine outran the thread by more
  than `max_pending_events`) skips one number: consumers see a gap that no
  replay can fill and take a snapshot, which the mirror keeps exact;
- `snapshot()` seals the pending events first, so the hashes it returns are
  exactly the state after every batch up to the sequence it names.

Heartbeats (`heartbeat.py`): every `heartbeat_interval_seconds` (0: none) the
thread sends one after the batches it has sent, naming the newest of them and
the publisher's epoch, so a consumer sees a lost last batch or a silent stream
within an interval.

Replay (vLLM's protocol): a DEALER/REQ client sends the first sequence number
it misses (8 bytes, big-endian); the answer is one message per buffered batch
from there, `[b"", seq, payload]`, then `[b"", -1, b""]`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from pagedinfer.contracts import validators
from pagedinfer.contracts.config.serve_args import DEFAULT_HEARTBEAT_INTERVAL_SECONDS
from pagedinfer.contracts.kv_events.events import KVCacheEvent, apply_event, coalesce, encode_batch
from pagedinfer.contracts.kv_events.frames import END_OF_REPLAY_SEQ, HEARTBEAT_SEQ, seq_from_bytes, seq_to_bytes
from pagedinfer.contracts.kv_events.heartbeat import Heartbeat, encode_heartbeat, new_epoch

logger = logging.getLogger("pagedinfer.kv_events")

FLUSH_INTERVAL_SECONDS = 0.005


@dataclass(frozen=True)
class KVEventsConfig:
    """Where to publish. port 0: any free port (read the bound ports from the discovery endpoint)."""

    host: str = "127.0.0.1"
    port: int = 5557  # PUB; the replay ROUTER socket binds port + 1 (or any free port when port is 0)
    topic: str = ""
    replay_buffer_batches: int = 10_000
    max_pending_events: int = 100_000
    heartbeat_interval_seconds: float = DEFAULT_HEARTBEAT_INTERVAL_SECONDS  # 0: no heartbeats

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65534:
            raise ValueError(f"--kv-events-port: must be 0 (any free port) or 1-65534, got {self.port}")
        validators.positive_int("replay_buffer_batches", self.replay_buffer_batches)
        validators.positive_int("max_pending_events", self.max_pending_events)
        if not 0 <= self.heartbeat_interval_seconds < float("inf"):
            raise ValueError(
                "--kv-events-heartbeat-seconds: must be a finite number >= 0 (0: no heartbeats),"
                f" got {self.heartbeat_interval_seconds}"
            )


@dataclass(frozen=True)
class Snapshot:
    sequence: int | None  # the last batch reflected; None before the first batch
    block_hashes: tuple[bytes, ...]  # in the device pool (medium GPU)
    tier_block_hashes: tuple[bytes, ...] = ()  # in the host tier (medium CPU, engine/kv_offload/)


class KVEventPublisher:
    def __init__(self, config: KVEventsConfig, block_size: int) -> None:
        self.config = config
        self.block_size = block_size
        self.epoch = new_epoch()  # this publisher's lifetime, in its heartbeats, discovery and snapshots
        self._lock = threading.Lock()
        self._mirror: set[bytes] = set()
        self._tier_mirror: set[bytes] = set()  # the host tier's hashes (events of medium CPU)
        self._pending: list[KVCacheEvent] = []
        self._sealed: deque[tuple[int, list[KVCacheEvent]]] = deque()  # sealed, not yet sent
        self._next_seq = 0
        self._last_seq: int | None = None
        self._dropped = False
        self.num_dropped_events = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.replay_buffer_batches)
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._bind_error: Exception | None = None
        self.pub_port: int | None = None
        self.replay_port: int | None = None
        self._thread = threading.Thread(target=self._run, name="pagedinfer-kv-events", daemon=True)

    # ----- engine side (any thread, O(1) under the lock) --------------------------------
    def record(self, event: KVCacheEvent) -> None:
        with self._lock:
            apply_event(self._mirror, event, self._tier_mirror)
            if len(self._pending) < self.config.max_pending_events:
                self._pending.append(event)
            else:
                self._dropped = True
                self.num_dropped_events += 1

    def snapshot(self) -> Snapshot:
        with self._lock:
            self._seal_locked()
            return Snapshot(self._last_seq, tuple(self._mirror), tuple(self._tier_mirror))

    def _seal_locked(self) -> None:
        if not self._pending and not self._dropped:
            return
        if self._dropped:
            self._next_seq += 1  # a gap no replay can fill: consumers re-snapshot
            self._dropped = False
        seq = self._next_seq
        self._next_seq += 1
        self._sealed.append((seq, self._pending))
        self._pending = []
        self._last_seq = seq

    # ----- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Bind both sockets (on the publisher's thread); ValueError if they cannot be bound."""
        self._thread.start()
        self._bound.wait()
        if self._bind_error is not None:
            raise ValueError(
                f"--kv-events-port: cannot bind {self.config.host}:{self.config.port}"
                f" (and the replay port above it): {self._bind_error}"
            )

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    # ----- the publisher thread ---------------------------------------------------------
    def _run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.PUB)
        replay = ctx.socket(zmq.ROUTER)
        for s in (pub, replay):
            s.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        try:
            host = self.config.host
            if self.config.port == 0:
                self.pub_port = pub.bind_to_random_port(f"tcp://{host}")
                self.replay_port = replay.bind_to_random_port(f"tcp://{host}")
            else:
                pub.bind(f"tcp://{host}:{self.config.port}")
                replay.bind(f"tcp://{host}:{self.config.port + 1}")
                self.pub_port, self.replay_port = self.config.port, self.config.port + 1
        except zmq.ZMQError as exc:
            self._bind_error = exc
            pub.close()
            replay.close()
            self._bound.set()
            return
        self._bound.set()
        topic = self.config.topic.encode()
        poller = zmq.Poller()
        poller.register(replay, zmq.POLLIN)
        interval = self.config.heartbeat_interval_seconds
        last_sent: int | None = None
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                if poller.poll(timeout=FLUSH_INTERVAL_SECONDS * 1000):
                    self._answer_replay(replay)
                with self._lock:
                    self._seal_locked()
                    sealed, self._sealed = self._sealed, deque()
                for seq, events in sealed:
                    payload = encode_batch(time.time(), coalesce(events))
                    pub.send_multipart([topic, seq_to_bytes(seq), payload], copy=False)
                    self._buffer.append((seq, payload))
                    last_sent = seq
                if interval > 0 and time.monotonic() >= next_beat:
                    beat = encode_heartbeat(time.time(), Heartbeat(last_sent, self.epoch, interval))
                    pub.send_multipart([topic, seq_to_bytes(HEARTBEAT_SEQ), beat], copy=False)
                    next_beat = time.monotonic() + interval
        except Exception:  # noqa: BLE001 - the engine keeps serving without events; say why once
            logger.exception("KV event publisher stopped")
        finally:
            pub.close()
            replay.close()

    def _answer_replay(self, replay) -> None:
        import zmq

        while True:
            try:
                frames = replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, start_frame = frames[0], frames[-1]
            try:
                start = seq_from_bytes(start_frame)
            except ValueError:
                start = None
            if start is not None:
                for seq, payload in list(self._buffer):
                    if seq >= start:
                        replay.send_multipart([identity, b"", seq_to_bytes(seq), payload])
            replay.send_multipart([identity, b"", seq_to_bytes(END_OF_REPLAY_SEQ), b""])
