"""KV cache manager: per-sequence block tables over the block pool, prefix hits,
copy-on-write for forked sequences, and the host swap pool.

Pure Python, no torch. The scheduler talks to this layer only; it never
touches a Block's internals.

Invariants:
- block tables are append-only while a sequence runs (blocks are replaced
  only by copy-on-write, in place, at the same index);
- a sequence never writes into a block with ref_cnt > 1: before such a write
  the block is copied (copy-on-write) and the copy goes into its table;
- only full, computed blocks are cached (hashed);
- a sequence is in at most one of `tables` (on the device) or `swapped` (on the host).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pagedinfer.engine.block_pool import Block, BlockPool, hash_block_tokens
from pagedinfer.engine.sequence import Sequence


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
    num_free_cpu_blocks: int


class KVCacheManager:
    def __init__(self, num_gpu_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 enable_prefix_caching: bool = True, watermark: float = 0.01) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_gpu_blocks, enable_caching=enable_prefix_caching)
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.tables: dict[int, list[Block]] = {}
        self.num_cached_blocks: dict[int, int] = {}  # how many of a table's blocks are registered
        self.num_cpu_blocks = num_cpu_blocks
        self.free_cpu_blocks: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self.swapped: dict[int, list[int]] = {}
        self.query_tokens = 0
        self.hit_tokens = 0
        self.preempted_query_tokens = 0
        self.preempted_hit_tokens = 0

    # ----- prefix cache -------------------------------------------------------------
    def _full_block_hashes(self, seq: Sequence, num_tokens: int) -> list[bytes]:
        """Chained hashes of seq's first num_tokens // block_size blocks (memoised on seq)."""
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_tokens // bs:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, seq.token_ids[i * bs:(i + 1) * bs]))
        return hashes[: num_tokens // bs]

    def get_computed_blocks(self, seq: Sequence) -> list[Block]:
        """Longest cached prefix of full blocks, leaving at least one token to compute."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        max_hit_tokens = seq.num_tokens - 1
        hits: list[Block] = []
        for i, h in enumerate(self._full_block_hashes(seq, max_hit_tokens)):
            block = self.pool.lookup(h, seq.token_ids[i * bs:(i + 1) * bs])
            if block is None:
                break
            hits.append(block)
        return hits

    # ----- allocation -----------------------------------------------------------------
    def _num_new_blocks(self, seq: Sequence, num_new_tokens: int, num_hit_blocks: int) -> int:
        table = self.tables.get(seq.seq_id, [])
        total_tokens = seq.num_computed_tokens + num_hit_blocks * self.block_size + num_new_tokens
        needed = -(-total_tokens // self.block_size) - len(table) - num_hit_blocks
        return max(needed, 0) + (1 if self._needs_cow(seq, num_new_tokens) else 0)

    def _needs_cow(self, seq: Sequence, num_new_tokens: int) -> bool:
        table = self.tables.get(seq.seq_id)
        if not table or num_new_tokens == 0:
            return False
        idx = seq.num_computed_tokens // self.block_size
        return idx < len(table) and table[idx].ref_cnt > 1

    def can_allocate(self, seq: Sequence, num_new_tokens: int, hits: list[Block] | None = None,
                     use_watermark: bool = False) -> bool:
        hits = hits or []
        needed = self._num_new_blocks(seq, num_new_tokens, len(hits))
        revived = sum(1 for b in hits if b.ref_cnt == 0)  # hits sitting in the free queue
        reserve = self.watermark_blocks if use_watermark else 0
        return needed + revived + reserve <= self.pool.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: list[Block] | None = None
                 ) -> list[tuple[int, int]]:
        """Give seq the blocks for num_new_tokens more tokens; returns copy-on-write (src, dst) pairs.

        `hits` (from get_computed_blocks, only when the sequence has no table yet)
        are taken as computed: seq.num_computed_tokens advances past them.
        """
        if not self.can_allocate(seq, num_new_tokens, hits):
            raise RuntimeError(f"sequence {seq.seq_id}: not enough free blocks")
        table = self.tables.setdefault(seq.seq_id, [])
        copies: list[tuple[int, int]] = []
        if hits:
            if table:
                raise RuntimeError("prefix hits apply only to a sequence without blocks")
            for block in hits:
                self.pool.touch(block)
            table.extend(hits)
            seq.num_computed_tokens += len(hits) * self.block_size
            self.num_cached_blocks[seq.seq_id] = len(hits)
        if self._needs_cow(seq, num_new_tokens):
            idx = seq.num_computed_tokens // self.block_size
            old = table[idx]
            (new,) = self.pool.allocate(1)
            self.pool.free([old])
            table[idx] = new
            copies.append((old.block_id, new.block_id))
        total_tokens = seq.num_computed_tokens + num_new_tokens
        missing = -(-total_tokens // self.block_size) - len(table)
        if missing > 0:
            table.extend(self.pool.allocate(missing))
        return copies

    def record_admission(self, seq: Sequence, num_hit_tokens: int, readmitted: bool) -> None:
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
            self.pool.cache_block(table[i], hashes[i], seq.token_ids[i * bs:(i + 1) * bs],
                                  parent_hash=hashes[i - 1] if i else None)
        self.num_cached_blocks[seq.seq_id] = num_full

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent (copy-on-write happens on the first divergent write)."""
        table = self.tables[parent.seq_id]
        for block in table:
            self.pool.share(block)
        self.tables[child.seq_id] = list(table)
        self.num_cached_blocks[child.seq_id] = self.num_cached_blocks.get(parent.seq_id, 0)

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks (tail first, so a chain's tail is evicted before its head)."""
        table = self.tables.pop(seq.seq_id, None)
        self.num_cached_blocks.pop(seq.seq_id, None)
        if table:
            self.pool.free(reversed(table))
        cpu = self.swapped.pop(seq.seq_id, None)
        if cpu:
            self.free_cpu_blocks.extend(cpu)

    def block_ids(self, seq: Sequence) -> list[int]:
        return [b.block_id for b in self.tables.get(seq.seq_id, ())]

    # ----- swapping --------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return len(self.tables.get(seq.seq_id, ())) <= len(self.free_cpu_blocks)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move seq's blocks to the host pool; returns (device block, host block) pairs to copy."""
        table = self.tables.pop(seq.seq_id)
        self.num_cached_blocks.pop(seq.seq_id, None)
        cpu_ids = [self.free_cpu_blocks.pop() for _ in table]
        self.swapped[seq.seq_id] = cpu_ids
        mapping = [(b.block_id, c) for b, c in zip(table, cpu_ids)]
        self.pool.free(reversed(table))
        return mapping

    def can_swap_in(self, seq: Sequence, num_new_tokens: int, use_watermark: bool = True) -> bool:
        """Room for seq's host blocks and for the blocks its next `num_new_tokens` tokens need."""
        reserve = self.watermark_blocks if use_watermark else 0
        num_host_blocks = len(self.swapped.get(seq.seq_id, ()))
        needed = max(num_host_blocks, -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size))
        return needed + reserve <= self.pool.num_free_blocks

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring seq's blocks back; returns (host block, device block) pairs to copy."""
        cpu_ids = self.swapped.pop(seq.seq_id)
        blocks = self.pool.allocate(len(cpu_ids))
        self.tables[seq.seq_id] = blocks
        self.num_cached_blocks[seq.seq_id] = 0
        self.free_cpu_blocks.extend(cpu_ids)
        return [(c, b.block_id) for c, b in zip(cpu_ids, blocks)]

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
            num_free_cpu_blocks=len(self.free_cpu_blocks),
        )

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        refs = Counter(b.block_id for t in self.tables.values() for b in t)
        for block in self.pool.blocks:
            if refs.get(block.block_id, 0) != block.ref_cnt:
                raise AssertionError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but {refs.get(block.block_id, 0)} tables")
        cpu = [c for ids in self.swapped.values() for c in ids] + self.free_cpu_blocks
        if sorted(cpu) != list(range(self.num_cpu_blocks)):
            raise AssertionError("host swap pool leaked or double-freed a block")
