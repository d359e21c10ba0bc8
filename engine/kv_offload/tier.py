"""`OffloadTier`: the tier's bookkeeping over the device pool and the host pool (pure Python, no torch).

It hooks the device pool's evictions (`BlockPool.on_evict`) and the host
pool's (a tier entry dropped for a swap-out or a newer entry), and collects
the step's copies for the runner: `take_copies()` once per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedinfer.engine.block_pool import Block, BlockPool

STORE, LOAD = "device_to_host", "host_to_device"  # the copy directions (the `direction` label of the metrics)


@dataclass(frozen=True)
class TierCopies:
    """The block copies one step needs, in the order the runner must run them (see the package docstring)."""

    stores: tuple[tuple[int, int], ...] = ()  # (device block, host block): device -> host, first of all
    loads: tuple[tuple[int, int], ...] = ()  # (host block, device block): host -> device, before the forward


@dataclass(frozen=True)
class TierStats:
    num_blocks: int  # the host pool's blocks (the tier's budget, shared with the swap space)
    num_cached_blocks: int  # tier entries now
    num_stored_blocks: int  # device -> host copies, cumulative
    num_loaded_blocks: int  # host -> device copies, cumulative
    hit_tokens: int  # prompt tokens served from the tier at a request's first admission, cumulative


class OffloadTier:
    def __init__(self, device: BlockPool, host: BlockPool, enabled: bool) -> None:
        self.device = device
        self.host = host
        self.enabled = enabled and device.enable_caching and host.num_blocks > 0
        self._stores: dict[int, int] = {}  # host block id -> device block id, this step's device -> host copies
        self._loads: list[tuple[int, int]] = []  # (host, device), this step's host -> device copies
        self.holds: list[Block] = []  # host blocks read this step; each loses one reference at the next step
        self.num_stored_blocks = 0
        self.num_loaded_blocks = 0
        self.hit_tokens = 0
        if self.enabled:
            device.on_evict = self._store
            host.on_evict = self._forget_store

    # ----- the device pool's evictions ------------------------------------------------------------
    def _store(self, block: Block) -> None:
        """A cached device block is being handed out for new content: keep its content in the tier."""
        if self.host.num_free_blocks == 0:
            return  # every host block is swapped or held this step: the content is dropped, as without a tier
        (host_block,) = self.host.allocate(1)  # may evict the least recently stored entry (`_forget_store`)
        self.host.cache_block(host_block, block.block_hash, block.token_ids, block.parent_hash)
        self.host.free([host_block])
        self._stores[host_block.block_id] = block.block_id
        self.num_stored_blocks += 1

    def _forget_store(self, host_block: Block) -> None:
        """A tier entry is evicted: a copy into it still pending this step is void (the new owner's wins)."""
        self._stores.pop(host_block.block_id, None)

    # ----- lookups and loads ----------------------------------------------------------------------
    def lookup(self, block_hash: bytes, token_ids: Sequence[int]) -> Block | None:
        """The tier's host block with this hash and these token ids, or None."""
        return self.host.lookup(block_hash, token_ids) if self.enabled else None

    def hold(self, host_block: Block) -> None:
        """Pin a tier hit until the next step (so allocating device blocks for it cannot evict it)."""
        self.host.touch(host_block)
        self.holds.append(host_block)

    def load(self, host_block: Block, device_block: Block) -> None:
        """Move a held tier entry's hash to a fresh device block and schedule the host -> device copy."""
        block_hash, token_ids, parent = host_block.block_hash, host_block.token_ids, host_block.parent_hash
        assert block_hash is not None and token_ids is not None
        self.host.uncache(host_block)
        self.device.cache_block(device_block, block_hash, token_ids, parent)
        self._loads.append((host_block.block_id, device_block.block_id))
        self.num_loaded_blocks += 1

    def discard(self, block_hash: bytes) -> None:
        """The device pool cached this hash afresh (computed again): the tier drops its copy (exclusive)."""
        if not self.enabled:
            return
        host_block = self.host.cached.get(block_hash)
        if host_block is not None:
            self.host.uncache(host_block)

    def defer_free(self, host_blocks: Sequence[Block]) -> None:
        """Release these host blocks at the next step, not now: this step's copies still read them."""
        if self.enabled:
            self.holds.extend(host_blocks)
        else:
            self.host.free(host_blocks, uncached_first=True)

    # ----- step boundaries ------------------------------------------------------------------------
    def begin_step(self) -> None:
        """The previous step's copies have run: its held host blocks may be reused (not while copies are
        still pending: a step that scheduled nothing ran none, and they go with the next one)."""
        if self.holds and not self._stores and not self._loads:
            holds, self.holds = self.holds, []
            self.host.free(holds, uncached_first=True)

    def take_copies(self) -> TierCopies:
        """This step's copies (each reported once)."""
        stores = tuple((device, host) for host, device in self._stores.items())
        loads = tuple(self._loads)
        self._stores.clear()
        self._loads.clear()
        return TierCopies(stores, loads)

    def reset(self) -> None:
        """Forget every tier entry (the prefix cache is reset)."""
        self.host.reset_prefix_cache(report=False)

    # ----- introspection --------------------------------------------------------------------------
    def stats(self) -> TierStats:
        return TierStats(
            num_blocks=self.host.num_blocks if self.enabled else 0,
            num_cached_blocks=len(self.host.cached),
            num_stored_blocks=self.num_stored_blocks,
            num_loaded_blocks=self.num_loaded_blocks,
            hit_tokens=self.hit_tokens,
        )

    def check_invariants(self, swapped_refs: dict[int, int]) -> None:
        """The package's invariants; swapped_refs: host block id -> swapped tables holding it."""
        self.host.check_invariants()
        both = self.device.cached.keys() & self.host.cached.keys()
        if both:
            raise AssertionError(f"{len(both)} hashes cached both on the device and in the tier")
        held: dict[int, int] = {}
        for b in self.holds:
            held[b.block_id] = held.get(b.block_id, 0) + 1
        for b in self.host.blocks:
            expected = swapped_refs.get(b.block_id, 0) + held.get(b.block_id, 0)
            if b.ref_cnt != expected:
                raise AssertionError(f"host block {b.block_id}: ref_cnt {b.ref_cnt}, {expected} swapped or held")
            if b.block_hash is not None and b.ref_cnt:
                raise AssertionError(f"host block {b.block_id} is referenced but keeps a tier hash")
        if len(self.host.cached) + sum(1 for b in self.host.blocks if b.ref_cnt) > self.host.num_blocks:
            raise AssertionError("the tier and the swap space exceed the host pool")
