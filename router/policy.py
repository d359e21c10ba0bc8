"""Routing decisions: scorers and a picker, pure functions over a snapshot of engine state.

After SGLang's router and llm-d's scheduler: each scorer maps an engine's
view to a number; `pick` combines them with the thresholds below. No I/O,
no clocks, no randomness: two routers with the same views pick the same engine.

Policies:
- round-robin: the engines in turn (the counter is the caller's);
- least-load: the fewest requests in flight (ties: the ring order of the key);
- prefix: the engine holding the longest cached prefix of the prompt (in
  blocks, from the engines' KV events; a block in an engine's host tier counts
  less than one in its device pool, by the cost of copying it back:
  `score_tiered_prefix`), unless that engine is saturated: it
  may carry at most `SATURATION_SLACK` more requests than the least-loaded
  engine, so a hot prefix spreads only when its engine queues up. Among the
  engines within the slack the longest match wins, then the lower load. A
  prompt no engine holds goes by consistent hashing with bounded load
  (Mirrokni et al. 2018): the ring is walked from the hash of the prompt's
  first block (a tenant's system prompt, so a tenant's turns meet again)
  to the first engine whose load is within `BOUNDED_LOAD_FACTOR` of the mean.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pagedinfer.contracts.routing.policies import POLICIES
from pagedinfer.router.hashing import num_cached_blocks

SATURATION_SLACK = 2  # requests in flight above the least-loaded engine before a prefix hit spreads
BOUNDED_LOAD_FACTOR = 1.0  # consistent hashing: an engine takes a new key while under this times the mean load
VIRTUAL_NODES = 64  # ring points per engine
# What a prefix block found in an engine's host tier costs, as a fraction of computing it: the copy back
# (host -> device). Measured by bench/kv_offload.py on the CPU engine of docs/kv-offload.md (0.023 and 0.030:
# a block copied in 0.36-0.60 ms, prefilled in 11.9-25.8 ms); `tier_hit_cost` derives it from any two such
# rates. On a GPU still to measure.
TIER_HIT_COST = 0.03


@dataclass(frozen=True)
class EngineView:
    """What the picker knows of one healthy engine at decision time."""

    name: str  # its URL
    num_inflight: int  # requests the router has sent it and not seen finish
    cached_hashes: frozenset[bytes] | set[bytes] = field(default_factory=frozenset)  # device pool; read only
    tier_hashes: frozenset[bytes] | set[bytes] = field(default_factory=frozenset)  # host tier; read only


@dataclass(frozen=True)
class Decision:
    engine: str
    matched_tokens: int  # of the prompt, cached on the chosen engine (per its events)
    reason: str  # prefix-hit | prefix-spread | hash | least-load | round-robin


def tier_hit_cost(copy_seconds_per_block: float, compute_seconds_per_block: float) -> float:
    """The fraction of a block's compute a tier hit still costs: copying it back, capped at 1 (no gain)."""
    if copy_seconds_per_block < 0 or compute_seconds_per_block <= 0:
        raise ValueError("copy_seconds_per_block must be >= 0 and compute_seconds_per_block > 0")
    return min(1.0, copy_seconds_per_block / compute_seconds_per_block)


def score_tiered_prefix(
    block_hashes: Sequence[bytes],
    device: set[bytes] | frozenset[bytes],
    tier: set[bytes] | frozenset[bytes],
    cost: float = TIER_HIT_COST,
) -> float:
    """The prompt's leading cached blocks, each worth 1 on the device and 1 - cost in the host tier.

    The prefix ends at the first block held in neither (hashes chain: a later block cannot be reused
    without it). So a device hit always outscores the same blocks in a tier, and a longer tier hit
    outscores a shorter device hit once the extra blocks outweigh the copies.
    """
    score = 0.0
    for h in block_hashes:
        if h in device:
            score += 1.0
        elif h in tier:
            score += 1.0 - cost
        else:
            break
    return score


def score_prefix(view: EngineView, block_hashes: Sequence[bytes]) -> int:
    """Leading blocks of the prompt cached on the engine, on its device or in its host tier."""
    if not view.tier_hashes:
        return num_cached_blocks(block_hashes, view.cached_hashes)
    n = 0
    for h in block_hashes:
        if h not in view.cached_hashes and h not in view.tier_hashes:
            break
        n += 1
    return n


def score_load(view: EngineView) -> int:
    return view.num_inflight


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def ring_order(names: Sequence[str], key: bytes) -> list[str]:
    """The engines in the order a consistent-hash ring meets them, starting at key's point."""
    points = sorted((_point(f"{name}#{v}"), name) for name in names for v in range(VIRTUAL_NODES))
    start = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    first = next((i for i, (p, _) in enumerate(points) if p >= start), 0)
    order: list[str] = []
    for i in range(len(points)):
        name = points[(first + i) % len(points)][1]
        if name not in order:
            order.append(name)
    return order


def bounded_load_capacity(loads: Sequence[int]) -> int:
    """The most requests an engine may carry and still take a new hashed key."""
    return math.ceil((sum(loads) + 1) / len(loads) * BOUNDED_LOAD_FACTOR)


def pick(
    policy: str, views: Sequence[EngineView], block_hashes: Sequence[bytes], block_size: int, key: bytes, turn: int
) -> Decision:
    """The engine for one request. views: healthy engines only (non-empty); turn: the round-robin counter."""
    if not views:
        raise ValueError("no healthy engine to pick from")
    if policy not in POLICIES:
        raise ValueError(f"policy: must be one of {POLICIES}, got {policy!r}")
    by_name = {v.name: v for v in views}
    order = ring_order(sorted(by_name), key)
    if policy == "round-robin":
        chosen = sorted(by_name)[turn % len(by_name)]
        return Decision(chosen, score_prefix(by_name[chosen], block_hashes) * block_size, "round-robin")
    if policy == "least-load":
        chosen = min(order, key=lambda n: (score_load(by_name[n]), order.index(n)))
        return Decision(chosen, score_prefix(by_name[chosen], block_hashes) * block_size, "least-load")
    scores = {n: score_tiered_prefix(block_hashes, v.cached_hashes, v.tier_hashes) for n, v in by_name.items()}
    min_load = min(score_load(v) for v in views)
    eligible = [n for n in order if score_load(by_name[n]) <= min_load + SATURATION_SLACK]
    best_anywhere = max(scores.values())
    chosen = max(eligible, key=lambda n: (scores[n], -score_load(by_name[n]), -order.index(n)))
    if scores[chosen] > 0:
        reason = "prefix-hit" if scores[chosen] == best_anywhere else "prefix-spread"
        return Decision(chosen, score_prefix(by_name[chosen], block_hashes) * block_size, reason)
    capacity = bounded_load_capacity([score_load(v) for v in views])
    chosen = next((n for n in order if score_load(by_name[n]) < capacity), order[0])
    reason = "hash" if best_anywhere == 0 else "prefix-spread"
    return Decision(chosen, 0, reason)
