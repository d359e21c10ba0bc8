"""The KV-event stream's heartbeat: "I am alive, and my latest batch is number N".

A publisher that only speaks when the cache changes cannot tell a quiet
engine from a dead stream: a lost last batch, or a publisher whose messages
stop while its HTTP side still answers, leaves a consumer's view wrong with
nothing to show it. So the publisher also sends, every
`heartbeat_interval_seconds` (`serve --kv-events-heartbeat-seconds`; 0: none),
one heartbeat on the PUB socket, after the batches it has sent:

- frames `[topic, seq, payload]` like a batch, with seq `HEARTBEAT_SEQ` (-2);
- payload msgpack `[ts, [], dp_rank, {"last_seq": N | nil, "epoch": E, "interval_seconds": I}]`:
  `last_seq` the newest batch sent before it (nil: none yet), `epoch` the
  publisher's random id for its lifetime (a restarted engine has a new one),
  `interval_seconds` the heartbeat interval, the one definition a consumer
  times silence against (also in GET /kv_events).

Compatibility: a consumer that predates heartbeats reads a batch numbered -2
with no events, below any number it expects, and ignores it (the router's
feed before this did exactly that). A consumer that knows heartbeats treats
`last_seq` above its own as a gap (replay, else snapshot), and a publisher
silent for one interval and a small slack (`router/feed_sync.py`) as
stale. An engine that sends none is followed as before.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Heartbeat:
    last_seq: int | None  # the newest batch the publisher sent before this heartbeat; None: none yet
    epoch: str  # the publisher's id for its lifetime (hex)
    interval_seconds: float  # the publisher sends one every this many seconds


def new_epoch() -> str:
    return secrets.token_hex(8)


def encode_heartbeat(ts: float, beat: Heartbeat) -> bytes:
    import msgpack

    return msgpack.packb(
        [ts, [], 0, {"last_seq": beat.last_seq, "epoch": beat.epoch, "interval_seconds": beat.interval_seconds}],
        use_bin_type=True,
    )


def decode_heartbeat(payload: bytes) -> Heartbeat:
    """A heartbeat payload; ValueError naming what is wrong otherwise."""
    import msgpack

    try:
        raw: Any = msgpack.unpackb(payload, raw=False)
    except Exception as exc:  # noqa: BLE001 - any msgpack failure is a malformed payload
        raise ValueError(f"KV event heartbeat: not msgpack ({exc})") from None
    body = raw[3] if isinstance(raw, (list, tuple)) and len(raw) >= 4 else None
    if not isinstance(body, dict) or not isinstance(body.get("epoch"), str):
        raise ValueError("KV event heartbeat: expected [ts, [], dp_rank, {last_seq, epoch, interval_seconds}]")
    last_seq, interval = body.get("last_seq"), body.get("interval_seconds")
    if (
        (last_seq is not None and not isinstance(last_seq, int))
        or not isinstance(interval, (int, float))
        or not interval > 0
    ):
        raise ValueError(f"KV event heartbeat: bad last_seq {last_seq!r} or interval_seconds {interval!r}")
    return Heartbeat(last_seq, body["epoch"], float(interval))
