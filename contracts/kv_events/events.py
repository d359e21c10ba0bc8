"""The KV-cache event vocabulary and its wire format (vLLM's `kv_events`).

Pure Python, no torch, no zmq: the engine's block pool emits these, the
publisher encodes them, the router decodes them.

Wire format (as vLLM's ZmqEventPublisher, so its consumers can read ours):
- a PUB message is three frames: topic (bytes), sequence number (8 bytes,
  big-endian, signed), payload;
- the payload is a msgpack array `[ts, events, dp_rank]`: ts in seconds since
  the epoch (float), dp_rank always 0 here;
- each event is a msgpack array led by its type name (msgspec's tagged,
  array-like encoding):
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
  `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`.
  Block hashes are 16-byte binary strings (see docs/router.md for how they
  are computed from token ids); lora_id is always nil.
- medium, as vLLM's: "GPU" for the device pool (even on a CPU engine), "CPU"
  for the host-memory offload tier (engine/kv_offload/). A block moving to
  the tier is BlockRemoved(GPU) then BlockStored(CPU); loaded back, it is
  BlockRemoved(CPU) then BlockStored(GPU). An event without a medium (an
  older engine) means "GPU".

State semantics: a consumer's view of an engine is a set of block hashes per
medium. Stored adds to its medium's set, Removed discards from it, Cleared
empties both. Every event sets a hash's membership outright, so applying a
batch twice leaves the same sets as once: a consumer may apply batches that a
snapshot already reflects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"  # the device pool
MEDIUM_CPU = "CPU"  # the host-memory offload tier
MEDIUMS = (MEDIUM_GPU, MEDIUM_CPU)


@dataclass(frozen=True)
class BlockStored:
    """Blocks newly cached; block_hashes[0]'s parent is parent_block_hash (None: a first block)."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]  # of all the blocks, concatenated
    block_size: int
    medium: str = MEDIUM_GPU


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks evicted from the prefix cache of one medium (their hashes no longer resolve there)."""

    block_hashes: tuple[bytes, ...]
    medium: str = MEDIUM_GPU


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    seq: int  # the engine's monotonically increasing batch number, from 0
    ts: float
    events: tuple[KVCacheEvent, ...]


def coalesce(events: Iterable[KVCacheEvent]) -> list[KVCacheEvent]:
    """Merge runs of BlockStored that extend one chain (as one sequence's blocks do) into one event."""
    out: list[KVCacheEvent] = []
    for event in events:
        last = out[-1] if out else None
        if (
            isinstance(event, BlockStored)
            and isinstance(last, BlockStored)
            and event.parent_block_hash == last.block_hashes[-1]
            and event.block_size == last.block_size
            and event.medium == last.medium
        ):
            out[-1] = BlockStored(
                last.block_hashes + event.block_hashes,
                last.parent_block_hash,
                last.token_ids + event.token_ids,
                last.block_size,
                last.medium,
            )
        else:
            out.append(event)
    return out


def apply_event(hashes: set[bytes], event: KVCacheEvent, tier: set[bytes] | None = None) -> None:
    """Apply one event to the device pool's set of cached block hashes and, if given, the host tier's
    (idempotent; see the module docstring). Without `tier`, events of the tier are ignored."""
    target = tier if getattr(event, "medium", MEDIUM_GPU) == MEDIUM_CPU else hashes
    if target is None:
        return
    if isinstance(event, BlockStored):
        target.update(event.block_hashes)
    elif isinstance(event, BlockRemoved):
        target.difference_update(event.block_hashes)
    else:
        hashes.clear()
        if tier is not None:
            tier.clear()


def _event_to_wire(event: KVCacheEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            None,
            event.medium,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), event.medium]
    return ["AllBlocksCleared"]


def _event_from_wire(raw: Any) -> KVCacheEvent:
    if isinstance(raw, dict):  # newer vLLM encodes a tagged event as a map with "type"
        tag = raw.get("type")
        fields = {
            "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
            "BlockRemoved": ("block_hashes", "medium"),
            "AllBlocksCleared": (),
        }.get(tag)
        if fields is None:
            raise ValueError(f"unknown KV event type {tag!r}")
        raw = [tag, *(raw.get(f) for f in fields)]
    if not isinstance(raw, (list, tuple)) or not raw or not isinstance(raw[0], str):
        raise ValueError(f"a KV event must be an array led by its type name, got {raw!r:.80}")
    tag = raw[0]
    if tag == "BlockStored" and len(raw) >= 5:
        return BlockStored(
            tuple(_hash(h) for h in raw[1]),
            None if raw[2] is None else _hash(raw[2]),
            tuple(int(t) for t in raw[3]),
            int(raw[4]),
            _medium(raw[6] if len(raw) > 6 else None),
        )
    if tag == "BlockRemoved" and len(raw) >= 2:
        return BlockRemoved(tuple(_hash(h) for h in raw[1]), _medium(raw[2] if len(raw) > 2 else None))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown or short KV event {tag!r}")


def _medium(value: Any) -> str:
    """An event's medium: None (an older engine) is the device pool; vLLM's other media count as the tier."""
    if value is None:
        return MEDIUM_GPU
    if not isinstance(value, str):
        raise ValueError(f"a KV event's medium must be a string, got {type(value).__name__}")
    return MEDIUM_GPU if value.upper() == MEDIUM_GPU else MEDIUM_CPU


def _hash(value: Any) -> bytes:
    """A block hash as bytes (vLLM also sends ints; they are taken as 8-byte big-endian)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, int):
        return value.to_bytes(8, "big", signed=value < 0)
    raise ValueError(f"a block hash must be bytes or an int, got {type(value).__name__}")


def encode_batch(ts: float, events: Iterable[KVCacheEvent], dp_rank: int = 0) -> bytes:
    import msgpack

    return msgpack.packb([ts, [_event_to_wire(e) for e in events], dp_rank], use_bin_type=True)


def decode_batch(seq: int, payload: bytes) -> EventBatch:
    """One payload; ValueError naming what is wrong if it is not a KV event batch."""
    import msgpack

    try:
        raw = msgpack.unpackb(payload, raw=False)
    except Exception as exc:  # noqa: BLE001 - any msgpack failure is a malformed payload
        raise ValueError(f"KV event batch {seq}: not msgpack ({exc})") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise ValueError(f"KV event batch {seq}: expected [ts, events, dp_rank]")
    return EventBatch(seq=seq, ts=float(raw[0]), events=tuple(_event_from_wire(e) for e in raw[1]))
