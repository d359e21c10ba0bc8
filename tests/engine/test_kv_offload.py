"""The prefix cache's host tier (engine/kv_offload/): exact outputs, accounting and the copies, end to end.

The pure bookkeeping (moves, LRU, the shared host pool, holds) runs in the
scheduler's state machine (tests/engine/test_scheduler.py) and below without a
model; one engine test runs a workload whose users return after their blocks
left the device pool.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedinfer.contracts.kv_events.events import BlockRemoved, BlockStored
from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.kv_cache_manager import KVCacheManager
from pagedinfer.engine.sampling_params import SamplingParams as Params
from pagedinfer.engine.sequence import Sequence


def _seq(tokens, t):
    return Sequence(request_id=f"r{t}", prompt_token_ids=list(tokens), params=Params(), arrival_time=float(t))


def _run(kv, seq):
    """Admit seq with its prefix hits and compute its prompt (as one step would), then finish it."""
    kv.begin_step()
    hits = kv.get_computed_blocks(seq)
    kv.allocate(seq, seq.num_tokens - len(hits) * kv.block_size, hits)
    copies = kv.take_tier_copies()
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_computed_blocks(seq)
    kv.free(seq)
    kv.check_invariants()
    return hits, copies


def test_an_evicted_block_moves_to_the_tier_and_back_with_its_events():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=3, enable_offload=True)
    events = []
    kv.pool.event_sink = kv.host.event_sink = events.append
    a = _seq(range(100, 109), 0)  # 2 full blocks + 1 token
    _run(kv, a)
    events.clear()
    _, copies = _run(kv, _seq(range(200, 213), 1))  # 4 blocks: evicts both of a's cached blocks
    assert len(copies.stores) == 2 and not copies.loads
    assert [(type(e).__name__, e.medium) for e in events[:3]] == [
        ("BlockRemoved", "GPU"),
        ("BlockStored", "CPU"),
        ("BlockRemoved", "GPU"),
    ]
    assert len(kv.host.cached) == 2 and kv.stats().tier.num_cached_blocks == 2
    events.clear()
    hits, copies = _run(kv, _seq(list(range(100, 109)) + [7], 2))  # a's user returns
    assert len(hits) == 2 and kv.num_tier_hits(hits) == 2  # both found in the tier
    assert [h for h, _ in copies.loads] and len(copies.loads) == 2
    removed_cpu = [e for e in events if isinstance(e, BlockRemoved) and e.medium == "CPU"]
    stored_gpu = [e for e in events if isinstance(e, BlockStored) and e.medium == "GPU"]
    assert {h for e in removed_cpu for h in e.block_hashes} >= {h for e in stored_gpu[:2] for h in e.block_hashes}
    assert kv.stats().tier.num_loaded_blocks == 2


def test_a_swap_out_takes_the_tiers_oldest_blocks_and_never_fails_for_it():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=2, enable_offload=True)
    _run(kv, _seq(range(100, 109), 0))
    _run(kv, _seq(range(200, 213), 1))
    assert len(kv.host.cached) == 2  # the tier fills the whole host pool
    s = _seq(range(300, 307), 2)
    kv.begin_step()
    kv.allocate(s, 7)
    assert kv.can_swap_out(s)
    kv.swap_out(s)
    assert len(kv.host.cached) == 0 and len(kv.swapped[s.seq_id]) == 2
    kv.check_invariants()
    kv.free(s)
    kv.check_invariants()
    assert kv.stats().num_free_cpu_blocks == 2


def test_a_host_block_read_this_step_is_not_overwritten_by_a_store_of_the_same_step():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=2, enable_offload=True)
    _run(kv, _seq(range(100, 109), 0))
    _run(kv, _seq(range(200, 213), 1))  # a's two blocks in the tier, b's four on the device
    kv.begin_step()
    a_again = _seq(range(100, 109), 2)
    hits = kv.get_computed_blocks(a_again)
    kv.allocate(a_again, 1, hits)  # loads both: evicts two of b's, whose stores need host blocks
    copies = kv.take_tier_copies()
    loaded_from = {h for h, _ in copies.loads}
    assert loaded_from and not loaded_from & {h for _, h in copies.stores}
    kv.check_invariants()


def test_a_swap_ins_host_blocks_are_not_reused_by_a_store_of_the_same_step():
    kv = KVCacheManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=2, enable_offload=True)
    s = _seq(range(100, 108), 0)
    kv.allocate(s, 8)
    s.num_computed_tokens = 8
    kv.cache_computed_blocks(s)
    kv.swap_out(s)
    _run(kv, _seq(range(200, 208), 1))  # four cached free device blocks now, the host pool all swapped
    kv.begin_step()
    swap_in = kv.swap_in(s)  # its device blocks evict two cached ones (no host block free: dropped)
    y = _seq(range(300, 308), 2)
    kv.allocate(y, 8)  # evicts the other two: their stores must not take the host blocks being read
    stores = kv.take_tier_copies().stores
    assert not {h for h, _ in swap_in} & {h for _, h in stores}
    kv.check_invariants()


PROMPTS = [[1] * 8 + [2] * 6, [1] * 8 + [3] * 9, [1] * 4 + [4] * 10, [5] * 12, [6] * 7, [1] * 8 + [2] * 8 + [7] * 5]


class TierMachine(RuleBasedStateMachine):
    """The KV cache manager with the tier and the swap space, and what each block HOLDS.

    Each rule is one step: the manager's decisions, then the copies in the runner's order (stores,
    swap-outs, swap-ins, loads), then the forward's writes. A full block's content is its chained hash,
    so the invariant "every cached block, on the device or in the tier, and every block of a live or
    swapped sequence holds what its hash says" proves the copy order and the holds right.
    """

    @initialize(num_gpu=st.sampled_from([4, 6, 8]), num_cpu=st.sampled_from([0, 2, 5]))
    def configure(self, num_gpu, num_cpu):
        self.kv = KVCacheManager(num_gpu, 4, num_cpu_blocks=num_cpu, enable_offload=True)
        self.device: dict[int, object] = {}
        self.host: dict[int, object] = {}
        self.live: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.ids = 0

    def _step(self, swap_out=(), swap_in=(), computed=()):
        copies = self.kv.take_tier_copies()
        for d, h in copies.stores:
            self.host[h] = self.device.get(d)
        for d, h in swap_out:
            self.host[h] = self.device.get(d)
        for h, d in swap_in:
            self.device[d] = self.host.get(h)
        for h, d in copies.loads:
            self.device[d] = self.host.get(h)
        for seq, start in computed:  # the forward writes the blocks of the tokens it computes
            table = self.kv.tables[seq.seq_id]
            hashes = self.kv._full_block_hashes(seq, seq.num_tokens)
            for i in range(start // 4, len(table)):
                self.device[table[i].block_id] = hashes[i] if i < len(hashes) else ("partial", seq.seq_id)
            seq.num_computed_tokens = seq.num_tokens
            self.kv.cache_computed_blocks(seq)

    def _admit(self, which, extra) -> list:
        """Admit a prompt with its prefix hits (within a step); the forward's writes it needs."""
        self.ids += 1
        seq = _seq(PROMPTS[which] + [9] * extra, self.ids)
        hits = self.kv.get_computed_blocks(seq)
        if not self.kv.can_allocate(seq, seq.num_tokens - 4 * len(hits), hits):
            return []
        self.kv.allocate(seq, seq.num_tokens - 4 * len(hits), hits)
        self.live.append(seq)
        return [(seq, seq.num_computed_tokens)]

    @rule(which=st.integers(0, len(PROMPTS) - 1), extra=st.integers(0, 5))
    def admit(self, which, extra):
        self.kv.begin_step()
        self._step(computed=self._admit(which, extra))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.kv.free(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def swap_out(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.kv.begin_step()
        if self.kv.can_swap_out(seq):
            self.live.remove(seq)
            self.swapped.append(seq)
            self._step(swap_out=self.kv.swap_out(seq))

    @precondition(lambda self: self.swapped)
    @rule(which=st.integers(0, len(PROMPTS) - 1), extra=st.integers(0, 5))
    def swap_in_and_admit(self, which, extra):
        """A swap-in and an admission in one step (the admission's stores may not take the freed host blocks)."""
        seq = self.swapped[0]
        self.kv.begin_step()
        if self.kv.can_swap_in([(seq, 0)], use_watermark=False):
            self.swapped.pop(0)
            self.live.append(seq)
            pairs = self.kv.swap_in(seq)
            self._step(swap_in=pairs, computed=self._admit(which, extra))

    @invariant()
    def every_block_holds_what_its_hash_says(self):
        self.kv.check_invariants()
        for block in self.kv.pool.cached.values():
            assert self.device.get(block.block_id) == block.block_hash, f"device block {block.block_id}"
        for block in self.kv.host.cached.values():
            assert self.host.get(block.block_id) == block.block_hash, f"tier block {block.block_id}"
        for seq in self.live:
            for block, h in zip(self.kv.tables[seq.seq_id], self.kv._full_block_hashes(seq, seq.num_tokens)):
                assert self.device.get(block.block_id) == h
        for seq in self.swapped:
            for block, h in zip(self.kv.swapped[seq.seq_id], self.kv._full_block_hashes(seq, seq.num_tokens)):
                assert self.host.get(block.block_id) == h
        stats = self.kv.stats()
        assert stats.tier.num_cached_blocks + sum(1 for b in self.kv.host.blocks if b.ref_cnt) <= stats.num_cpu_blocks

    def teardown(self):
        for seq in self.live + self.swapped:
            self.kv.free(seq)
        self.kv.take_tier_copies()
        self.kv.begin_step()
        self.kv.check_invariants()
        assert self.kv.stats().num_free_blocks == self.kv.pool.num_blocks
        assert self.kv.stats().num_free_cpu_blocks == self.kv.num_cpu_blocks


TestTierMachine = TierMachine.TestCase
TestTierMachine.settings = settings(max_examples=80, stateful_step_count=25, deadline=None)


@pytest.fixture(scope="module")
def engines(tiny_llama):
    common = dict(
        model=str(tiny_llama),
        block_size=16,
        max_model_len=128,
        num_gpu_blocks_override=8,
        max_num_batched_tokens=128,
        dtype="float32",
    )
    return LLM(**common), LLM(**common, kv_offloading_size=0.001)


def test_greedy_output_is_identical_with_the_tier_and_its_hits_are_counted(engines):
    off, on = engines
    users = [[(u * 37 + i) % 200 + 8 for i in range(70)] for u in range(3)]  # 4 full blocks each + 6 tokens
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def conversation(llm):
        first = [llm.generate([u], params)[0] for u in users]  # each user evicts the one before
        again = [
            llm.generate([u + f.outputs[0].token_ids + [9, 10, 11]], params)[0] for u, f in zip(users, first)
        ]  # the users come back in the order they left
        return first + again

    without, with_tier = conversation(off), conversation(on)
    assert [o.outputs[0].token_ids for o in with_tier] == [o.outputs[0].token_ids for o in without]
    stats = on.get_stats()
    assert stats.prefix_cache_offload_hit_tokens >= 3 * 64  # every returning user's 4 blocks came back
    assert sum(o.num_cached_tokens for o in with_tier[3:]) >= 3 * 64
    assert sum(o.num_cached_tokens for o in without[3:]) < 3 * 64
    assert (
        stats.kv_offload_bytes["host_to_device"]
        == stats.prefix_cache_offload_hit_tokens // 16 * on.llm_engine.bytes_per_block
    )
    assert stats.kv_offload_bytes["device_to_host"] > 0
    assert stats.kv_offload_copy_seconds["host_to_device"] > 0
    assert stats.num_used_blocks == 0 and stats.kv_offload_cached_blocks > 0
    on.llm_engine.kv.check_invariants()
