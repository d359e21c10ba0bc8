"""The router's table of hot prefixes, built from its own traffic (pure: no I/O, no clock).

A prefix is keyed by the model its requests named (a replay must name it
too) and its first full block (a tenant's system prompt starts there;
consistent hashing keys on it too). Each entry keeps the token ids
that every request seen under its key shared (their longest common prefix,
cut to whole blocks and to `MAX_PREFIX_TOKENS`) and a score: the number of
requests seen, decayed by half every `half_life_requests` requests the
router sees (so a tenant that stopped sending fades). At most `max_entries`
entries; past that the lowest score goes.

Invariants: an entry's ids are a whole number of blocks, at least one;
`hottest` is deterministic (score, then key, break ties).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedinfer.contracts.routing.warmup import MAX_ENTRIES
from pagedinfer.router.warmup.settings import MAX_PREFIX_TOKENS

HALF_LIFE_REQUESTS = 2000


@dataclass
class HotPrefix:
    key: tuple[str, tuple[int, ...]]  # (the requests' model, the first block's token ids)
    token_ids: list[int]  # whole blocks, shared by every request seen under key
    count: float  # decayed request count as of `tick`
    tick: int


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class HotnessTable:
    def __init__(
        self,
        block_size: int,
        half_life_requests: int = HALF_LIFE_REQUESTS,
        max_entries: int = MAX_ENTRIES,
        max_prefix_tokens: int = MAX_PREFIX_TOKENS,
    ) -> None:
        if block_size < 1 or half_life_requests < 1 or max_entries < 1 or max_prefix_tokens < block_size:
            raise ValueError("block_size, half_life_requests, max_entries >= 1 and max_prefix_tokens >= block_size")
        self.block_size = block_size
        self.half_life_requests = half_life_requests
        self.max_entries = max_entries
        self.max_prefix_tokens = max_prefix_tokens - max_prefix_tokens % block_size
        self.entries: dict[tuple[str, tuple[int, ...]], HotPrefix] = {}
        self.tick = 0

    def score(self, entry: HotPrefix) -> float:
        return entry.count * 0.5 ** ((self.tick - entry.tick) / self.half_life_requests)

    def observe(self, model: str, token_ids: Sequence[int]) -> None:
        """Count one request's prompt (shorter than a block: not a prefix anyone can cache)."""
        b = self.block_size
        if len(token_ids) < b:
            return
        self.tick += 1
        key = (model, tuple(token_ids[:b]))
        entry = self.entries.get(key)
        if entry is None:
            length = min(len(token_ids), self.max_prefix_tokens)
            self.entries[key] = HotPrefix(key, list(token_ids[: length - length % b]), 1.0, self.tick)
            if len(self.entries) > self.max_entries:
                coldest = min(self.entries.values(), key=lambda e: (self.score(e), e.key))
                del self.entries[coldest.key]
            return
        shared = _common_length(entry.token_ids, token_ids)
        del entry.token_ids[max(b, shared - shared % b) :]
        entry.count, entry.tick = self.score(entry) + 1.0, self.tick

    def hottest(self) -> list[HotPrefix]:
        """Every entry, hottest first (ties: by key)."""
        return sorted(self.entries.values(), key=lambda e: (-self.score(e), e.key))
