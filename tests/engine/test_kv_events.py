"""The block pool reports every change to its prefix cache; the events encode as vLLM's wire format."""

from __future__ import annotations

import random

import msgpack

from pagedinfer.contracts.kv_events.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    apply_event,
    coalesce,
    decode_batch,
    encode_batch,
)
from pagedinfer.engine.kv_cache_manager import KVCacheManager
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sequence import Sequence
from pagedinfer.router.hashing import prefix_block_hashes

BLOCK = 4


def _seq(prompt: list[int]) -> Sequence:
    return Sequence("r", list(prompt), SamplingParams(), 0.0)


def _run(kv: KVCacheManager, seq: Sequence) -> None:
    hits = kv.get_computed_blocks(seq)
    kv.allocate(seq, seq.num_tokens - len(hits) * BLOCK, hits)
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_computed_blocks(seq)


def test_events_replayed_on_a_set_equal_the_pools_cached_hashes_through_random_traffic():
    kv = KVCacheManager(num_gpu_blocks=24, block_size=BLOCK)
    events = []
    kv.pool.event_sink = events.append
    rng = random.Random(0)
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    mirror: set[bytes] = set()
    for _i in range(200):
        prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        seq = _seq(prompt)
        if not kv.can_allocate(seq, seq.num_tokens):
            continue
        _run(kv, seq)
        if rng.random() < 0.02:
            kv.pool.reset_prefix_cache()
        kv.free(seq)
        for e in events:
            apply_event(mirror, e)
        events.clear()
        assert mirror == set(kv.pool.cached)
    assert any(isinstance(e, BlockRemoved) for e in coalesce([BlockRemoved((b"x",))]))


def test_stored_blocks_carry_the_hashes_a_consumer_computes_from_token_ids():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=BLOCK)
    events = []
    kv.pool.event_sink = events.append
    prompt = list(range(11))
    _run(kv, _seq(prompt))
    (stored,) = coalesce(events)
    assert stored.block_hashes == tuple(prefix_block_hashes(prompt, BLOCK))
    assert stored.parent_block_hash is None and stored.token_ids == tuple(prompt[:8])


def test_batches_encode_as_vllm_tagged_arrays_and_decode_back():
    events = [
        BlockStored((b"a" * 16, b"b" * 16), None, (1, 2, 3, 4, 5, 6, 7, 8), 4),
        BlockRemoved((b"a" * 16,)),
        AllBlocksCleared(),
    ]
    payload = encode_batch(12.5, events)
    ts, raw, dp_rank = msgpack.unpackb(payload)
    assert (ts, dp_rank) == (12.5, 0)
    assert raw[0] == ["BlockStored", [b"a" * 16, b"b" * 16], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU"]
    assert raw[1] == ["BlockRemoved", [b"a" * 16], "GPU"] and raw[2] == ["AllBlocksCleared"]
    assert decode_batch(7, payload).events == tuple(events)


def test_the_medium_travels_and_an_event_without_one_is_the_device_pools():
    """vLLM's `medium`: "CPU" for the host tier (engine/kv_offload/); an older engine's events have none."""
    h = b"c" * 16
    moved = [BlockRemoved((h,), "GPU"), BlockStored((h,), None, (1, 2, 3, 4), 4, "CPU")]
    assert decode_batch(1, encode_batch(1.0, moved)).events == tuple(moved)
    old = msgpack.packb([1.0, [["BlockStored", [h], None, [1, 2, 3, 4], 4], ["BlockRemoved", [h]]], 0])
    assert [e.medium for e in decode_batch(2, old).events] == ["GPU", "GPU"]
    device, tier = {h}, set()
    for event in moved:  # a move to the tier: out of the device set, into the tier's
        apply_event(device, event, tier)
    assert (device, tier) == (set(), {h})
    apply_event(device, BlockStored((b"d" * 16,), None, (5, 6, 7, 8), 4, "CPU"))  # no tier set: ignored
    assert device == set()
    apply_event(device, AllBlocksCleared(), tier)
    assert tier == set()
    assert coalesce([BlockStored((h,), None, (1,), 1, "GPU"), BlockStored((b"e" * 16,), h, (2,), 1, "CPU")]) == [
        BlockStored((h,), None, (1,), 1, "GPU"),
        BlockStored((b"e" * 16,), h, (2,), 1, "CPU"),
    ]  # media never merge
