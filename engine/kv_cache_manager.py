"""KV cache manager: per-sequence block tables over the block pool, prefix hits,
copy-on-write for forked sequences, the host swap pool and the prefix cache's
host tier (engine/kv_offload/: one host pool serves both).

Pure Python, no torch. The scheduler talks to this layer only; it never
touches a Block's internals.

Invariants:
- block tables are append-only while a sequence runs (blocks are replaced
  only by copy-on-write, in place, at the same index);
- a sequence never writes into a block with ref_cnt > 1: before such a write
  the block is copied (copy-on-write) and the copy goes into its table;
- only full, computed blocks are cached (hashed);
- a sequence is in at most one of `tables` (on the device) or `swapped` (on the host);
- a host block's ref_cnt is the number of swapped tables holding it, plus one
  while a step's copy still reads it (`OffloadTier.holds`); it is free exactly
  when that is 0 (a free host block with a hash is a tier entry);
- every change to a table is marked in `changes` at the first index it
  touches (a freed or swapped-out table at 0), so `take_table_deltas` tells
  the runner exactly what changed since it last asked (engine/batch/).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from pagedinfer.contracts.kv_events.block_hash import hash_block_tokens
from pagedinfer.contracts.kv_events.events import MEDIUM_CPU
from pagedinfer.engine.batch.deltas import TableChanges, TableDeltas
from pagedinfer.engine.block_pool import Block, BlockPool
from pagedinfer.engine.kv_offload.tier import OffloadTier, TierCopies, TierStats
from pagedinfer.engine.sequence import Sequence

T = TypeVar("T")


@dataclass(frozen=True)
class KVCacheStats:
    num_total_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_free_blocks: int
    prefix_cache_query_tokens: int  # prompt tokens of requests at their first admission
    prefix_cache_hit_tokens: int  # of those, tokens served by the cache
    prefix_cache_preempted_query_tokens: int  # tokens of recompute-preempted sequences looked up again
    prefix_cache_preempted_hit_tokens: int  # of those, tokens found (their own blocks, mostly)
    num_cpu_blocks: int
    num_free_cpu_blocks: int  # free host blocks (tier entries among them: evictable)
    tier: TierStats


class KVCacheManager:
    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
        watermark: float = 0.01,
        enable_offload: bool = False,
    ) -> None:
        """num_cpu_blocks: the host pool (swap space plus the tier's); enable_offload: keep evicted prefix
        blocks in it (engine/kv_offload/)."""
        self.block_size = block_size
        self.pool = BlockPool(num_gpu_blocks, enable_caching=enable_prefix_caching)
        self.host = BlockPool(num_cpu_blocks, enable_caching=enable_prefix_caching, medium=MEDIUM_CPU)
        self.tier = OffloadTier(self.pool, self.host, enable_offload)
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.tables: dict[int, list[Block]] = {}
        self.num_cached_blocks: dict[int, int] = {}  # how many of a table's blocks are registered
        self.num_cpu_blocks = num_cpu_blocks
        self.swapped: dict[int, list[Block]] = {}  # host blocks of swapped-out sequences
        self.query_tokens = 0
        self.hit_tokens = 0
        self.preempted_query_tokens = 0
        self.preempted_hit_tokens = 0
        self.changes = TableChanges()

    # ----- prefix cache -------------------------------------------------------------
    def _full_block_hashes(self, seq: Sequence, num_tokens: int) -> list[bytes]:
        """Chained hashes of seq's first num_tokens // block_size blocks (memoised on seq)."""
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_tokens // bs:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, seq.token_ids[i * bs : (i + 1) * bs]))
        return hashes[: num_tokens // bs]

    def get_computed_blocks(self, seq: Sequence) -> list[Block]:
        """Longest cached prefix of full blocks, leaving at least one token to compute.

        Each hit is a device block, or a host block of the tier (`num_tier_hits` counts them) whose content
        `allocate` loads into a fresh device block.
        """
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        max_hit_tokens = seq.num_tokens - 1
        hits: list[Block] = []
        lookup_tier = self.tier.lookup
        for i, h in enumerate(self._full_block_hashes(seq, max_hit_tokens)):
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            block = self.pool.lookup(h, tokens) or lookup_tier(h, tokens)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_tier_hits(self, hits: list[Block]) -> int:
        """How many of get_computed_blocks' hits come from the host tier."""
        return sum(1 for b in hits if self.host.owns(b)) if self.tier.enabled else 0

    # ----- allocation -----------------------------------------------------------------
    def _num_new_blocks(self, seq: Sequence, num_new_tokens: int, num_hit_blocks: int) -> int:
        """Blocks that num_new_tokens more tokens (after num_hit_blocks prefix hits) take: the missing ones,
        plus one if the first written block is shared (copy-on-write). One table lookup (run per sequence
        per step)."""
        bs = self.block_size
        table = self.tables.get(seq.seq_id)
        num_table = len(table) if table else 0
        total_tokens = seq.num_computed_tokens + num_hit_blocks * bs + num_new_tokens
        needed = -(-total_tokens // bs) - num_table - num_hit_blocks
        if needed < 0:
            needed = 0
        if num_table and num_new_tokens:  # _needs_cow, inline
            idx = seq.num_computed_tokens // bs
            if idx < num_table and table[idx].ref_cnt > 1:
                needed += 1
        return needed

    def fits_in_place(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether seq's next num_new_tokens go into blocks its table already holds, the first written one
        its own (ref_cnt 1): then `allocate` would change nothing (no block, no copy, no table change).

        The scheduler's fast path for a running sequence (a decode needs a new block once every
        block_size tokens): one dict lookup and the slot arithmetic, no allocation call.
        """
        table = self.tables.get(seq.seq_id)
        if not table:
            return False
        computed = seq.num_computed_tokens
        return (
            computed + num_new_tokens <= len(table) * self.block_size
            and table[computed // self.block_size].ref_cnt == 1
        )

    def _needs_cow(self, seq: Sequence, num_new_tokens: int) -> bool:
        table = self.tables.get(seq.seq_id)
        if not table or num_new_tokens == 0:
            return False
        idx = seq.num_computed_tokens // self.block_size
        return idx < len(table) and table[idx].ref_cnt > 1

    def _num_copies(self, writes: list[tuple[Sequence, int]]) -> int:
        """Copy-on-write blocks that writing num_new_tokens into each sequence costs, allocated in this order.

        A shared block that w of its r owners write is copied min(w, r - 1)
        times: the writers that come while others still hold it copy, and the
        last owner, if it writes too, writes in place. (For beams forked from
        one parent, only their shared last block is copied, once per writer but one.)
        """
        writers: Counter[int] = Counter()
        blocks: dict[int, Block] = {}
        for seq, num_new_tokens in writes:
            if self._needs_cow(seq, num_new_tokens):
                block = self.tables[seq.seq_id][seq.num_computed_tokens // self.block_size]
                writers[block.block_id] += 1
                blocks[block.block_id] = block
        return sum(min(w, blocks[b].ref_cnt - 1) for b, w in writers.items())

    def can_allocate_all(self, writes: list[tuple[Sequence, int]]) -> bool:
        """Room for every (sequence, num_new_tokens) of a unit scheduled together (a beam group).

        For one sequence this is `can_allocate` without hits; for several it
        counts the copy-on-write blocks they share exactly (`_num_copies`).
        """
        if len(writes) == 1:
            return self.can_allocate(*writes[0])
        needed = sum(self._num_new_blocks(seq, n, 0) - (1 if self._needs_cow(seq, n) else 0) for seq, n in writes)
        return needed + self._num_copies(writes) <= self.pool.num_free_blocks

    def can_allocate(
        self, seq: Sequence, num_new_tokens: int, hits: list[Block] | None = None, use_watermark: bool = False
    ) -> bool:
        if not hits:  # every running sequence's step: no hits to revive
            needed = self._num_new_blocks(seq, num_new_tokens, 0)
            return needed + (self.watermark_blocks if use_watermark else 0) <= self.pool.num_free_blocks
        needed = self._num_new_blocks(seq, num_new_tokens, len(hits))
        # hits sitting in the free queue, and the tier's (free host blocks), each taking a free device block
        revived = sum(1 for b in hits if b.ref_cnt == 0)
        reserve = self.watermark_blocks if use_watermark else 0
        return needed + revived + reserve <= self.pool.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: list[Block] | None = None) -> list[tuple[int, int]]:
        """Give seq the blocks for num_new_tokens more tokens; returns copy-on-write (src, dst) pairs.

        `hits` (from get_computed_blocks, only when the sequence has no table yet)
        are taken as computed: seq.num_computed_tokens advances past them.
        """
        if not self.can_allocate(seq, num_new_tokens, hits):
            raise RuntimeError(f"sequence {seq.seq_id}: not enough free blocks")
        table = self.tables.setdefault(seq.seq_id, [])
        first_changed = len(table)
        copies: list[tuple[int, int]] = []
        if hits:
            if table:
                raise RuntimeError("prefix hits apply only to a sequence without blocks")
            tier_hits = [b for b in hits if self.host.owns(b)] if self.tier.enabled else []
            for block in hits:
                if tier_hits and self.host.owns(block):
                    self.tier.hold(block)  # before allocating: a store must not evict it
                else:
                    self.pool.touch(block)
            if tier_hits:
                loaded = iter(self.pool.allocate(len(tier_hits)))
                hits = list(hits)
                for i, block in enumerate(hits):
                    if self.host.owns(block):
                        hits[i] = next(loaded)
                        self.tier.load(block, hits[i])
            table.extend(hits)
            seq.num_computed_tokens += len(hits) * self.block_size
            self.num_cached_blocks[seq.seq_id] = len(hits)
        if self._needs_cow(seq, num_new_tokens):
            idx = seq.num_computed_tokens // self.block_size
            old = table[idx]
            (new,) = self.pool.allocate(1)
            self.pool.free([old])
            table[idx] = new
            first_changed = min(first_changed, idx)
            copies.append((old.block_id, new.block_id))
        total_tokens = seq.num_computed_tokens + num_new_tokens
        missing = -(-total_tokens // self.block_size) - len(table)
        if missing > 0:
            table.extend(self.pool.allocate(missing))
        if first_changed < len(table):
            self.changes.mark(seq.seq_id, first_changed)
        return copies

    def record_admission(
        self, seq: Sequence, num_hit_tokens: int, readmitted: bool, num_tier_hit_tokens: int = 0
    ) -> None:
        """Count the prefix-cache lookup of an admission from the waiting queue (in tokens).

        A request's first admission is its one prefix-cache query: its prompt
        tokens, and the hits among them. A re-admission after recompute
        preemption looks up the sequence's own prompt and generated tokens,
        whose freed blocks are usually still cached: those are not prompt-cache
        hits, so they are counted apart (as vLLM separates preempted lookups).
        """
        if readmitted:
            self.preempted_query_tokens += seq.num_tokens
            self.preempted_hit_tokens += num_hit_tokens
        else:
            self.query_tokens += seq.num_prompt_tokens
            self.hit_tokens += num_hit_tokens
            self.tier.hit_tokens += num_tier_hit_tokens

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register seq's full, computed blocks in the prefix cache (after a step)."""
        if not self.enable_prefix_caching:
            return
        table = self.tables.get(seq.seq_id)
        if not table:
            return
        done = self.num_cached_blocks.get(seq.seq_id, 0)
        num_full = min(seq.num_computed_tokens // self.block_size, len(table))
        if num_full <= done:
            return
        hashes = self._full_block_hashes(seq, num_full * self.block_size)
        bs = self.block_size
        for i in range(done, num_full):
            canonical = self.pool.cache_block(
                table[i], hashes[i], seq.token_ids[i * bs : (i + 1) * bs], parent_hash=hashes[i - 1] if i else None
            )
            if canonical is table[i]:
                self.tier.discard(hashes[i])  # computed again: the device copy is the one cached
        self.num_cached_blocks[seq.seq_id] = num_full

    def fork(self, parent: Sequence, child: Sequence, num_tokens: int | None = None) -> None:
        """child shares parent's blocks (copy-on-write happens on the first divergent write).

        With num_tokens, only the blocks holding parent's first num_tokens
        tokens are shared (a parked beam forked again from its group's leader
        at their common prefix); the child computes its own tokens from there.
        """
        table = self.tables[parent.seq_id]
        num_parent_cached = self.num_cached_blocks.get(parent.seq_id, 0)
        if num_tokens is not None:
            table = table[: -(-num_tokens // self.block_size)]
            num_parent_cached = min(num_parent_cached, num_tokens // self.block_size)
        for block in table:
            self.pool.share(block)
        self.tables[child.seq_id] = list(table)
        self.num_cached_blocks[child.seq_id] = num_parent_cached
        self.changes.mark(child.seq_id, 0)

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks (tail first, so a chain's tail is evicted before its head)."""
        table = self.tables.pop(seq.seq_id, None)
        self.num_cached_blocks.pop(seq.seq_id, None)
        if table is not None:
            self.changes.mark(seq.seq_id, 0)
        if table:
            self.pool.free(reversed(table))
        self.host.free(self.swapped.pop(seq.seq_id, ()), uncached_first=True)

    def block_ids(self, seq: Sequence) -> list[int]:
        return [b.block_id for b in self.tables.get(seq.seq_id, ())]

    def take_table_deltas(self) -> TableDeltas:
        """What changed in the device block tables since the last call (each change is reported once)."""

        def table_of(seq_id: int) -> list[int] | None:
            table = self.tables.get(seq_id)
            return None if table is None else [b.block_id for b in table]

        return self.changes.take(table_of)

    # ----- swapping --------------------------------------------------------------------
    # Swapping moves a unit: one sequence, or the running beams of a group. A device
    # block the unit's tables share goes to one host block, referenced as often
    # (cpu_ref_cnt), and comes back as one device block, so sharing survives the trip.
    @staticmethod
    def _distinct_blocks(tables: Iterable[Iterable[T]]) -> list[T]:
        """Every block (device Block or host id) of the tables once, in order of first use."""
        return list(dict.fromkeys(b for table in tables for b in table))

    def can_swap_out(self, *seqs: Sequence) -> bool:
        """Room in the host pool (the tier's entries give way: they are free blocks)."""
        return len(self._distinct_blocks(self.tables.get(s.seq_id, ()) for s in seqs)) <= self.host.num_free_blocks

    def swap_out(self, *seqs: Sequence) -> list[tuple[int, int]]:
        """Move the unit's blocks to the host pool; returns (device block, host block) pairs to copy."""
        tables = [self.tables.pop(s.seq_id) for s in seqs]
        distinct = self._distinct_blocks(tables)
        host_of: dict[int, Block] = dict(zip((b.block_id for b in distinct), self.host.allocate(len(distinct))))
        for seq, table in zip(seqs, tables):
            self.changes.mark(seq.seq_id, 0)
            self.num_cached_blocks.pop(seq.seq_id, None)
            self.swapped[seq.seq_id] = [host_of[b.block_id] for b in table]
        for host_block, refs in Counter(h for t in tables for h in (host_of[b.block_id] for b in t)).items():
            for _ in range(refs - 1):
                self.host.share(host_block)
        for table in tables:
            self.pool.free(reversed(table))
        return [(d, h.block_id) for d, h in host_of.items()]

    def can_swap_in(self, writes: list[tuple[Sequence, int]], use_watermark: bool = True) -> bool:
        """Room for the unit's host blocks and for the blocks each sequence's next tokens need.

        writes: (sequence, num_new_tokens) for every sequence of the unit.
        """
        reserve = self.watermark_blocks if use_watermark else 0
        host_tables = [self.swapped.get(s.seq_id, []) for s, _ in writes]
        needed = len(self._distinct_blocks(host_tables))
        writers: Counter[int] = Counter()
        for (seq, num_new), host in zip(writes, host_tables):
            needed += max(0, -(-(seq.num_computed_tokens + num_new) // self.block_size) - len(host))
            idx = seq.num_computed_tokens // self.block_size
            if num_new and idx < len(host):
                writers[host[idx]] += 1
        needed += sum(min(w, c.ref_cnt - 1) for c, w in writers.items())
        return needed + reserve <= self.pool.num_free_blocks

    def swap_in(self, *seqs: Sequence) -> list[tuple[int, int]]:
        """Bring the unit's blocks back; returns (host block, device block) pairs to copy."""
        host_tables = [self.swapped.pop(s.seq_id) for s in seqs]
        distinct = self._distinct_blocks(host_tables)
        device_of = dict(zip(distinct, self.pool.allocate(len(distinct))))
        for seq, host in zip(seqs, host_tables):
            self.tables[seq.seq_id] = [device_of[c] for c in host]
            self.num_cached_blocks[seq.seq_id] = 0
            self.changes.mark(seq.seq_id, 0)
        refs = Counter(c for host in host_tables for c in host)
        for c, block in device_of.items():
            for _ in range(refs[c] - 1):
                self.pool.share(block)
        for host in host_tables:
            self.tier.defer_free(host)  # this step's swap-in copies still read them
        return [(c.block_id, b.block_id) for c, b in device_of.items()]

    # ----- the host tier's step boundary ------------------------------------------------------
    def begin_step(self) -> None:
        """A step is being scheduled: the previous step's copies have run (its held host blocks are free)."""
        self.tier.begin_step()

    def take_tier_copies(self) -> TierCopies:
        return self.tier.take_copies()

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash, on the device and in the tier (one AllBlocksCleared)."""
        self.tier.reset()
        self.pool.reset_prefix_cache()

    # ----- introspection ---------------------------------------------------------------
    def stats(self) -> KVCacheStats:
        return KVCacheStats(
            num_total_blocks=self.pool.num_blocks,
            num_used_blocks=self.pool.num_used_blocks,
            num_free_blocks=self.pool.num_free_blocks,
            num_cached_free_blocks=self.pool.num_cached_free_blocks,
            prefix_cache_query_tokens=self.query_tokens,
            prefix_cache_hit_tokens=self.hit_tokens,
            prefix_cache_preempted_query_tokens=self.preempted_query_tokens,
            prefix_cache_preempted_hit_tokens=self.preempted_hit_tokens,
            num_cpu_blocks=self.num_cpu_blocks,
            num_free_cpu_blocks=self.host.num_free_blocks,
            tier=self.tier.stats(),
        )

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        refs = Counter(b.block_id for t in self.tables.values() for b in t)
        for block in self.pool.blocks:
            if refs.get(block.block_id, 0) != block.ref_cnt:
                raise AssertionError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but {refs.get(block.block_id, 0)} tables"
                )
        host_refs = Counter(c.block_id for blocks in self.swapped.values() for c in blocks)
        try:
            self.tier.check_invariants(host_refs)
        except AssertionError as exc:
            raise AssertionError(f"host swap pool or tier: {exc}") from None
