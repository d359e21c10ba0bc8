"""The KV block pool: physical blocks, their reference counts, and the prefix cache.

Pure Python, no torch. The pool hands out block ids; tensors live in the
model runner.

Invariants (checked by `check_invariants`, exercised by the tests' state machine):
- every block is either referenced (ref_cnt > 0, not in the free queue) or
  free (ref_cnt == 0, in the free queue exactly once);
- a block with a hash is in `cached` under that hash, and only there;
- num_free + num_used == num_blocks.

Prefix caching (automatic, lazy eviction): a FULL block gets a hash chained
over its parent's hash and its token ids (`contracts/kv_events/block_hash.py`). When freed
it keeps its hash and goes to the free queue; a later request whose prefix
hashes to it takes it back out of the queue (O(1), from the middle) after
its token ids are compared, so a hash collision is never reused silently.
The hash is dropped only when the block is handed out for new content.

KV events: with an `event_sink` set, the pool reports each hash it registers
(BlockStored), each hash it drops on eviction (BlockRemoved) and a reset
(AllBlocksCleared), in the order they happen, so a consumer's set of hashes
equals `cached`'s keys (docs/router.md). Every event carries the pool's
`medium` ("GPU" for the device pool, even on a CPU engine; "CPU" for the
host pool of the offload tier, engine/kv_offload/).

Offload hook: with `on_evict` set, a cached block handed out for new content
is passed to it just before its hash is dropped (after its BlockRemoved), so
the host tier can keep its content (engine/kv_offload/).

Eviction order of the free queue: least recently freed first; callers free a
request's blocks tail-first, so among blocks freed together the tail of a
chain is evicted before its head, and a shared prefix survives longest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pagedinfer.contracts.kv_events.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent


@dataclass(eq=False)
class Block:
    """One physical KV block. prev/next thread it through the free queue."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    token_ids: tuple[int, ...] | None = None  # content of a cached (hashed) block, for verification
    parent_hash: bytes | None = None  # the hash its chain continues (None: a first block), for KV events
    prev_free: Block | None = field(default=None, repr=False)
    next_free: Block | None = field(default=None, repr=False)
    in_free_queue: bool = False


class FreeBlockQueue:
    """Doubly linked list of free blocks: popleft evicts, remove() is O(1) from anywhere."""

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(block_id=-1)  # sentinels; never handed out
        self._tail = Block(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for b in blocks:
            self.append(b)

    def append(self, block: Block) -> None:
        if block.in_free_queue:
            raise RuntimeError(f"block {block.block_id} is already free (double free)")
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        block.in_free_queue = True
        self.num_free_blocks += 1

    def remove(self, block: Block) -> None:
        if not block.in_free_queue:
            raise RuntimeError(f"block {block.block_id} is not in the free queue")
        assert block.prev_free is not None and block.next_free is not None
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        block.in_free_queue = False
        self.num_free_blocks -= 1

    def appendleft(self, block: Block) -> None:
        """Put a free block first in line for reuse (one holding no content worth keeping)."""
        if block.in_free_queue:
            raise RuntimeError(f"block {block.block_id} is already free (double free)")
        first = self._head.next_free
        assert first is not None
        block.prev_free, block.next_free = self._head, first
        self._head.next_free = first.prev_free = block
        block.in_free_queue = True
        self.num_free_blocks += 1

    def popleft(self) -> Block:
        first = self._head.next_free
        if first is None or first is self._tail:
            raise RuntimeError("no free blocks")
        self.remove(first)
        return first

    def __iter__(self):
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free


class BlockPool:
    """Fixed set of blocks with reference counts and a hash -> block prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, medium: str = MEDIUM_GPU) -> None:
        if (
            isinstance(num_blocks, bool)
            or not isinstance(num_blocks, int)
            or num_blocks < 0
            or (num_blocks == 0 and medium == MEDIUM_GPU)
        ):
            raise ValueError(f"num_blocks: must be an integer >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, Block] = {}
        self.num_cached_free_blocks = 0
        self.peak_num_used_blocks = 0  # high-water mark of num_used_blocks (reset_peak restarts it)
        self.event_sink: Callable[[KVCacheEvent], None] | None = None
        self.medium = medium  # of the events it reports
        self.on_evict: Callable[[Block], None] | None = None  # a cached block about to lose its hash to new content

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[Block]:
        """Take num_blocks free blocks for new content (evicting their cached hashes)."""
        if num_blocks > self.num_free_blocks:
            raise RuntimeError(f"cannot allocate {num_blocks} blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            self._evict(block, offload=True)
            block.ref_cnt = 1
            out.append(block)
        self.peak_num_used_blocks = max(self.peak_num_used_blocks, self.num_used_blocks)
        return out

    def owns(self, block: Block) -> bool:
        """Whether block is one of this pool's (the device pool's and the host pool's ids overlap)."""
        return 0 <= block.block_id < self.num_blocks and self.blocks[block.block_id] is block

    def _evict(self, block: Block, report: bool = True, offload: bool = False) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
                if report and self.event_sink is not None:
                    self.event_sink(BlockRemoved((block.block_hash,), self.medium))
                if offload and self.on_evict is not None:
                    self.on_evict(block)
            if block.in_free_queue or block.ref_cnt == 0:
                self.num_cached_free_blocks -= 1
            block.block_hash = None
            block.token_ids = None
            block.parent_hash = None

    def uncache(self, block: Block) -> None:
        """Drop a block's hash now (its content moved to the other tier); a free one goes first in line."""
        if block.block_hash is None:
            return
        self._evict(block)
        if block.in_free_queue:
            self.free_queue.remove(block)
            self.free_queue.appendleft(block)

    def lookup(self, block_hash: bytes, token_ids: Sequence[int]) -> Block | None:
        """The cached block with this hash AND these token ids, or None."""
        block = self.cached.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def touch(self, block: Block) -> None:
        """Take a reference on a cached block (a prefix hit), reviving it if free."""
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
            self.num_cached_free_blocks -= 1
            self.peak_num_used_blocks = max(self.peak_num_used_blocks, self.num_used_blocks)
        block.ref_cnt += 1

    def share(self, block: Block) -> None:
        """Add a reference to a block already in use (forking a sequence)."""
        if block.ref_cnt < 1:
            raise RuntimeError(f"block {block.block_id} is free; cannot share it")
        block.ref_cnt += 1

    def cache_block(
        self, block: Block, block_hash: bytes, token_ids: Sequence[int], parent_hash: bytes | None = None
    ) -> Block:
        """Register a full, computed block under its hash. Returns the block now canonical for it.

        If another block already holds this hash, that one stays canonical (the
        caller keeps using its own copy; it is simply not cached).
        """
        if not self.enable_caching or block.block_hash is not None:
            return block
        existing = self.cached.get(block_hash)
        if existing is not None:
            return existing
        block.block_hash = block_hash
        block.token_ids = tuple(token_ids)
        block.parent_hash = parent_hash
        self.cached[block_hash] = block
        if block.ref_cnt == 0:  # a free block given content (the host tier's store)
            self.num_cached_free_blocks += 1
        if self.event_sink is not None:
            self.event_sink(BlockStored((block_hash,), parent_hash, block.token_ids, len(block.token_ids), self.medium))
        return block

    def free(self, blocks: Iterable[Block], uncached_first: bool = False) -> None:
        """Drop one reference from each block, in the order given (callers pass tail-first).

        uncached_first: a freed block without a hash goes to the head of the queue, reused before any
        cached one (the host pool: a swapped sequence's blocks hold nothing the tier could reuse).
        """
        for block in blocks:
            if block.ref_cnt < 1:
                raise RuntimeError(f"block {block.block_id} freed twice")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if uncached_first and block.block_hash is None:
                    self.free_queue.appendleft(block)
                else:
                    self.free_queue.append(block)
                if block.block_hash is not None:
                    self.num_cached_free_blocks += 1

    def reset_peak(self) -> None:
        self.peak_num_used_blocks = self.num_used_blocks

    def reset_prefix_cache(self, report: bool = True) -> None:
        """Forget every cached hash (e.g. after weights change); report: say AllBlocksCleared."""
        for block in list(self.cached.values()):
            self._evict(block, report=False)
        if report and self.event_sink is not None:
            self.event_sink(AllBlocksCleared())

    def check_invariants(self) -> None:
        free_ids = [b.block_id for b in self.free_queue]
        if len(free_ids) != len(set(free_ids)) or len(free_ids) != self.num_free_blocks:
            raise AssertionError("free queue corrupt")
        for b in self.blocks:
            if b.in_free_queue != (b.ref_cnt == 0):
                raise AssertionError(f"block {b.block_id}: ref_cnt {b.ref_cnt}, in_free_queue {b.in_free_queue}")
            if b.block_hash is not None and self.cached.get(b.block_hash) is not b:
                raise AssertionError(f"block {b.block_id} has a hash but is not the cached block for it")
        if sum(1 for b in self.blocks if b.ref_cnt == 0 and b.block_hash is not None) != self.num_cached_free_blocks:
            raise AssertionError("num_cached_free_blocks out of sync")
