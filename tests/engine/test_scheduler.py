"""Scheduler + KV cache manager, driven without a model.

The driver plays the model runner: after each step, sequences whose tokens are
all computed get one new token. A hypothesis state machine runs random
add/step/abort/fork sequences in both preemption modes, with and without the
prefix cache's host tier (sharing the host pool with the swap space), and
checks the pools' invariants after every rule; no block leaks and none is
freed twice (the tier's own machine, with block contents: test_kv_offload.py). The
driver also keeps the runner's persistent batch from the steps' block-table
deltas alone, and checks after every step that it equals the KV cache
manager's tables (preemption, swapping, prefix hits, chunked prefill, forks,
beams and aborts included).
"""

from __future__ import annotations

import itertools
import random
import weakref

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedinfer.engine.batch.persistent_batch import PersistentBatch
from pagedinfer.engine.kv_cache_manager import KVCacheManager
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.scheduler import RequestCounts, Scheduler
from pagedinfer.engine.scheduler_config import SchedulerConfig
from pagedinfer.engine.sequence import Sequence, SequenceStatus


def make(
    num_blocks=16,
    block_size=4,
    mode="recompute",
    budget=16,
    max_seqs=4,
    chunked=True,
    cpu=16,
    watermark=0.0,
    tier=False,
):
    cfg = SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=max_seqs, enable_chunked_prefill=chunked, preemption_mode=mode
    )
    kv = KVCacheManager(num_blocks, block_size, num_cpu_blocks=cpu, watermark=watermark, enable_offload=tier)
    return Scheduler(cfg, kv), kv


def new_seq(tokens, t, rid=None):
    return Sequence(
        request_id=rid or f"r{t}", prompt_token_ids=list(tokens), params=SamplingParams(), arrival_time=float(t)
    )


_mirrors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheduler -> the runner's batch


def check_deltas(sched, out) -> None:
    """Apply the step's table deltas, as the runner does: its tables then equal the manager's, whole."""
    batch = _mirrors.setdefault(sched, PersistentBatch(sched.kv.block_size, num_rows=2, max_blocks_per_seq=2))
    if not out.scheduled:
        assert out.table_deltas.updates == () and out.table_deltas.freed_seq_ids == ()
        return
    batch.apply(out.table_deltas)
    assert set(batch.row_of) == {s for s, t in sched.kv.tables.items() if t}
    for seq_id, table in sched.kv.tables.items():
        if table:
            assert batch.table(seq_id) == [b.block_id for b in table], f"sequence {seq_id}"


def step(sched, beam_step=None):
    """One step as the engine takes it; beam_step(group) plays the beam search for a group whose
    beams have all computed their last token (beams never get the driver's token 7)."""
    out = sched.schedule()
    check_deltas(sched, out)
    sched.after_step(out)
    groups = {}
    for item in out.scheduled:
        s = item.seq
        if s.group is not None:
            groups[id(s.group)] = s.group
        elif s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(7)
    for group in groups.values():
        if all(b.status is SequenceStatus.RUNNING and b.num_computed_tokens == b.num_tokens for b in group.seqs):
            beam_step(group)
    return out


def test_decodes_and_a_chunked_prefill_share_one_step():
    sched, _ = make(num_blocks=32, budget=8)
    a = new_seq(range(3), 0)
    sched.add(a)
    step(sched)  # a prefilled, now decoding
    b = new_seq(range(20), 1)
    sched.add(b)
    out = step(sched)
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(a, 1), (b, 7)]
    assert out.num_batched_tokens == 8


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    sched, _ = make(num_blocks=32, budget=16, chunked=False)
    a, b = new_seq(range(10), 0), new_seq(range(10), 1)
    sched.add(a)
    sched.add(b)
    out = step(sched)
    assert [i.seq for i in out.scheduled] == [a]  # b (10 tokens) does not fit the remaining 6


def test_preemption_takes_the_latest_arrival_and_it_comes_back_first():
    sched, kv = make(num_blocks=4, block_size=4, budget=64)
    a, b = new_seq(range(7), 0), new_seq(range(7), 1)
    sched.add(a)
    sched.add(b)
    step(sched)  # both hold 2 blocks: the pool is full
    out = step(sched)  # a's 8th token fits block 2; b's 8th does too
    out = step(sched)  # a needs a 3rd block: b (latest) is preempted
    assert b in out.preempted and a not in out.preempted
    assert sched.waiting[0] is b and b.num_computed_tokens == 0
    assert sched.counters.num_preemptions["recompute"] == 1
    kv.check_invariants()


def test_swap_mode_moves_the_victim_to_host_memory():
    sched, kv = make(num_blocks=4, block_size=4, budget=64, mode="swap")
    a, b = new_seq(range(7), 0), new_seq(range(7), 1)
    for s in (a, b):
        sched.add(s)
    for _ in range(3):
        out = step(sched)
    assert b.status is SequenceStatus.SWAPPED and out.blocks_to_swap_out
    sched.finish(a, "stop")
    out = step(sched)
    assert b.status is SequenceStatus.RUNNING and out.blocks_to_swap_in
    kv.check_invariants()


def test_head_of_line_request_is_not_starved_by_later_small_ones():
    sched, _ = make(num_blocks=6, block_size=4, budget=64)
    big = new_seq(range(24), 0)  # needs all 6 blocks
    filler = new_seq(range(3), -1)
    sched.add(filler)
    step(sched)
    sched.add(big)
    small = new_seq(range(2), 1)
    sched.add(small)
    out = step(sched)
    assert big not in [i.seq for i in out.scheduled]
    assert small not in [i.seq for i in out.scheduled], "FCFS: a later request must not jump the queue"
    assert sched.counters.num_allocation_failures >= 1
    sched.finish(filler, "stop")
    out = step(sched)
    assert [i.seq for i in out.scheduled][0] is big


def run_to_completion(sched, seqs, output_tokens):
    """Step until every sequence has output_tokens tokens; return the scheduler outputs."""
    outs = []
    while sched.num_unfinished:
        outs.append(step(sched))
        for s in seqs:
            if s.num_output_tokens >= output_tokens and not s.is_finished:
                sched.finish(s, "length")
    return outs


@pytest.mark.parametrize("mode, cpu", [("recompute", 0), ("swap", 1)], ids=["recompute", "swap-pool-too-small"])
def test_a_recompute_after_preemption_is_no_prefix_cache_hit(mode, cpu):
    """Unrelated prompts under forced preemption: the victim's re-admission finds its own freed blocks,
    which is counted apart, never as a prompt-cache query or hit (a 1-block host pool cannot take the
    2-block victim, so swap mode falls back to recompute)."""
    sched, kv = make(num_blocks=4, block_size=4, budget=64, mode=mode, cpu=cpu)
    a, b = new_seq(range(7), 0), new_seq(range(100, 107), 1)
    sched.add(a)
    sched.add(b)
    outs = run_to_completion(sched, [a, b], output_tokens=6)
    assert any(b in out.preempted for out in outs)
    stats = kv.stats()
    assert stats.prefix_cache_hit_tokens == 0
    assert stats.prefix_cache_query_tokens == 14  # each prompt once, at its first admission
    assert stats.prefix_cache_preempted_hit_tokens > 0  # b found its own blocks again
    assert stats.prefix_cache_preempted_query_tokens >= b.num_prompt_tokens + 1
    assert b.num_cached_tokens == 0
    kv.check_invariants()


def test_a_swapped_victim_is_never_looked_up_again():
    sched, kv = make(num_blocks=4, block_size=4, budget=64, mode="swap", cpu=16)
    a, b = new_seq(range(7), 0), new_seq(range(100, 107), 1)
    sched.add(a)
    sched.add(b)
    outs = run_to_completion(sched, [a, b], output_tokens=6)
    assert any(out.blocks_to_swap_out for out in outs)
    stats = kv.stats()
    assert (stats.prefix_cache_hit_tokens, stats.prefix_cache_query_tokens) == (0, 14)
    assert stats.prefix_cache_preempted_query_tokens == stats.prefix_cache_preempted_hit_tokens == 0


def test_requests_are_counted_once_whatever_their_n():
    sched, kv = make(num_blocks=16, block_size=4, budget=64, max_seqs=4)
    parent = new_seq(range(5), 0, rid="req-a")
    parent.num_forks_pending = 3  # n = 4
    other = new_seq(range(50, 55), 1, rid="req-b")
    other.num_forks_pending = 3
    sched.add(parent)
    sched.add(other)
    assert sched.num_requests() == RequestCounts(running=0, waiting=2, swapped=0)
    step(sched)  # parent holds all 4 seats: other waits
    assert sched.num_requests() == RequestCounts(running=1, waiting=1, swapped=0)
    children = []
    for i in range(3):
        child = new_seq(parent.prompt_token_ids, 2 + i, rid="req-a")
        child.token_ids = list(parent.token_ids)
        sched.fork(parent, child)
        children.append(child)
    parent.num_forks_pending = 0
    assert len(sched.running) == 4
    assert sched.num_requests() == RequestCounts(running=1, waiting=1, swapped=0)
    sched._preempt([children[-1]], [])  # a preempted child waits, but its request still runs
    assert sched.num_requests() == RequestCounts(running=1, waiting=1, swapped=0)
    for s in (parent, *children):
        sched.finish(s, "abort")
    assert sched.num_requests() == RequestCounts(running=0, waiting=1, swapped=0)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ids = itertools.count()
        self.live: list[Sequence] = []
        self.added: list[Sequence] = []  # every sequence added to the queue (not forked); beam group leaders too
        self.groups: list = []  # live beam groups

    @rule(
        mode=st.sampled_from(["recompute", "swap"]),
        cpu=st.sampled_from([0, 4, 16]),
        watermark=st.sampled_from([0.0, 0.1]),
        num_blocks=st.sampled_from([8, 12]),
        tier=st.booleans(),
    )
    def configure(self, mode, cpu, watermark, num_blocks, tier):
        if not hasattr(self, "sched"):
            self.sched, self.kv = make(
                num_blocks=num_blocks, block_size=4, mode=mode, budget=12, cpu=cpu, watermark=watermark, tier=tier
            )
            self.max_model_len = num_blocks * 4  # the engine's bound: every request fits the pool

    def _ready(self):
        return hasattr(self, "sched")

    @precondition(_ready)
    @rule(length=st.integers(1, 20), prefix=st.sampled_from([0, 4, 8]))
    def add(self, length, prefix):
        t = next(self.ids)
        tokens = [1] * prefix + [t % 50 + 2] * length
        if len(tokens) + 8 > self.max_model_len:
            return
        s = new_seq(tokens, t)
        self.sched.add(s)
        self.live.append(s)
        self.added.append(s)

    @precondition(_ready)
    @rule(length=st.integers(1, 16), width=st.integers(1, 3))
    def add_beam_group(self, length, width):
        from pagedinfer.engine.beam.group import max_group_blocks
        from pagedinfer.engine.beam.params import BeamSearchParams
        from pagedinfer.engine.sequence import SequenceGroup

        if (
            sum(self.sched.seats(s) for s in self.sched.running) + width > self.sched.config.max_num_seqs
            or max_group_blocks(length, BeamSearchParams(width, 6), 4) > self.kv.pool.num_blocks
        ):
            return  # as the engine's check_request: a group that cannot fit the pool alone is refused
        t = next(self.ids)
        leader = new_seq([t % 50 + 2] * length, t)
        leader.group = SequenceGroup(leader.request_id, width, [leader])
        self.sched.add(leader)
        self.added.append(leader)
        self.groups.append(leader.group)

    def _beam_step(self, group):
        """A random beam step: up to beam_width children of random parents; pruned parents freed."""
        from pagedinfer.engine.beam.group import advance
        from pagedinfer.engine.beam.search import BeamStep

        if group.leader.num_output_tokens >= 5:
            advance(self.sched, group, BeamStep((), (), True), None)
            self.groups.remove(group)
            return
        parents = tuple(sorted(self.rng.randrange(len(group.seqs)) for _ in range(group.beam_width)))
        tokens = tuple(self.rng.randrange(2, 60) for _ in parents)

        def fork(parent):
            child = new_seq(parent.prompt_token_ids, next(self.ids), rid=parent.request_id)
            child.token_ids, child.group = list(parent.token_ids), group
            child.block_hashes = list(parent.block_hashes)
            self.sched.fork(parent, child)
            return child

        advance(self.sched, group, BeamStep(parents, tokens, False), fork)

    @precondition(_ready)
    @rule(seed=st.integers(0, 2**16))
    def run_step(self, seed):
        self.rng = random.Random(seed)
        out = step(self.sched, self._beam_step)
        assert out.scheduled or not self.sched.num_unfinished, "unfinished sequences but an empty step"
        assert out.num_batched_tokens <= self.sched.config.max_num_batched_tokens
        assert len(self.sched.running) <= self.sched.config.max_num_seqs
        for group in self.groups:  # a group runs whole or not at all, its running beams side by side
            running = [i for i, s in enumerate(self.sched.running) if s.group is group]
            assert running == list(range(running[0], running[0] + len(running))) if running else True
            assert not running or all(s.status in (SequenceStatus.RUNNING, SequenceStatus.WAITING) for s in group.seqs)
            assert sum(s.status is SequenceStatus.RUNNING for s in group.seqs) in (0, 1, len(group.seqs))
        for s in list(self.live):
            if s.num_output_tokens >= 6 and not s.is_finished:
                self.sched.finish(s, "length")
                self.live.remove(s)

    @precondition(lambda self: self._ready() and self.live)
    @rule(data=st.data())
    def abort(self, data):
        s = data.draw(st.sampled_from(self.live))
        self.sched.finish(s, "abort")
        self.live.remove(s)

    @precondition(lambda self: self._ready() and self.groups)
    @rule(data=st.data())
    def abort_group(self, data):
        group = data.draw(st.sampled_from(self.groups))
        for s in group.seqs:
            self.sched.finish(s, "abort")
        self.groups.remove(group)

    @precondition(
        lambda self: (
            self._ready()
            and sum(self.sched.seats(s) for s in self.sched.running) < self.sched.config.max_num_seqs
            and any(s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens - 1 for s in self.live)
        )
    )
    @rule()
    def fork(self):
        parent = next(
            s for s in self.live if s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens - 1
        )
        child = new_seq(parent.prompt_token_ids, next(self.ids))
        child.token_ids = list(parent.token_ids)
        self.sched.fork(parent, child)
        self.live.append(child)

    @invariant()
    def pool_is_consistent(self):
        if self._ready():
            self.kv.check_invariants()
            stats = self.kv.stats()
            assert stats.num_free_blocks + stats.num_used_blocks == stats.num_total_blocks
            # one prefix-cache query per request, in prompt tokens, however often it was preempted
            assert stats.prefix_cache_query_tokens == sum(s.num_prompt_tokens for s in self.added if s.was_admitted)
            assert stats.prefix_cache_hit_tokens <= stats.prefix_cache_query_tokens
            assert stats.tier.hit_tokens <= stats.prefix_cache_hit_tokens
            counts = self.sched.num_requests()
            unfinished = {s.request_id for s in self.live if not s.is_finished} | {g.request_id for g in self.groups}
            assert counts.running + counts.waiting + counts.swapped == len(unfinished)

    def teardown(self):
        if self._ready():
            for s in self.live + [b for g in self.groups for b in g.seqs]:
                self.sched.finish(s, "abort")
            self.kv.take_tier_copies()  # as the next step would run them: then its held host blocks are free
            self.kv.begin_step()
            self.kv.check_invariants()
            assert self.kv.stats().num_free_blocks == self.kv.stats().num_total_blocks
            assert self.kv.stats().num_free_cpu_blocks == self.kv.num_cpu_blocks


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def beam_group(sched, tokens, num_beams, t):
    """A beam group: a prompt that prefills, then num_beams beams forked from it, each with its own token."""
    from pagedinfer.engine.sequence import SequenceGroup

    leader = new_seq(tokens, t)
    group = SequenceGroup(leader.request_id, num_beams, [leader])
    leader.group = group
    sched.add(leader)
    return group


def fork_beams(sched, group, num_beams):
    leader = group.leader
    for _ in range(1, num_beams):
        child = new_seq(leader.prompt_token_ids, 0, rid=leader.request_id)
        child.token_ids, child.group = list(leader.token_ids), group
        sched.fork(leader, child)
        group.seqs.append(child)
    for i, s in enumerate(group.seqs):
        s.token_ids.append(100 + i)


def prefill(sched, group):
    out = sched.schedule()
    sched.after_step(out)
    assert all(s.num_computed_tokens == s.num_tokens for s in group.seqs)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_beam_group_is_preempted_and_resumed_as_a_whole(mode):
    sched, kv = make(num_blocks=8, block_size=4, mode=mode, budget=32)
    older = new_seq(range(8), 0)  # 2 full blocks, then one more for its decodes
    sched.add(older)
    group = beam_group(sched, range(50, 56), 3, 1)  # 6 tokens: blocks [4] + [2 of 4], shared by the beams
    prefill(sched, group)
    older.token_ids.append(7)
    fork_beams(sched, group, 3)
    assert sched.seats(group.leader) == 3 and sched.seats(group.seqs[1]) == 0
    assert kv.stats().num_free_blocks == 4
    older.token_ids.extend([7] * 8)  # older now needs 3 more blocks: with the beams' 2 copies, 5 > 4 free
    out = sched.schedule()
    assert set(out.preempted) == set(group.seqs) and [i.seq for i in out.scheduled] == [older]
    assert [s.status for s in group.seqs] == [SequenceStatus.SWAPPED if mode == "swap" else SequenceStatus.WAITING] * 3
    queue = sched.swapped if mode == "swap" else sched.waiting
    assert list(queue) == [group.leader]  # only the leader is queued; the other beams follow it
    sched.after_step(out)
    sched.finish(older, "stop")
    out = sched.schedule()
    sched.after_step(out)
    if mode == "recompute":  # the leader recomputed its 7 tokens; the others are forked from it again
        assert [i.seq for i in out.scheduled] == [group.leader]
        assert all(s.status is SequenceStatus.RUNNING for s in group.seqs)
        assert [s.num_computed_tokens for s in group.seqs] == [7, 6, 6]
        out = sched.schedule()
        sched.after_step(out)
    resumed = group.seqs[1:] if mode == "recompute" else group.seqs  # swap: all beams, their last token each
    assert sorted(i.seq.seq_id for i in out.scheduled) == sorted(s.seq_id for s in resumed)
    assert len({kv.block_ids(s)[0] for s in group.seqs}) == 1  # the prompt's full block is shared again
    assert all(s.num_computed_tokens == s.num_tokens for s in group.seqs)
    for s in group.seqs:
        sched.finish(s, "stop")
    kv.check_invariants()
    assert kv.stats().num_free_blocks == 8 and kv.stats().num_free_cpu_blocks == kv.num_cpu_blocks


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_random_beam_groups_under_a_tight_pool_finish_and_leak_nothing(mode):
    """Beam groups (random steps: forks, prunes) and plain sequences in a pool that forces preemption:
    every step schedules something, groups run whole, and every block comes back."""
    from pagedinfer.engine.beam.group import advance
    from pagedinfer.engine.beam.search import BeamStep
    from pagedinfer.engine.sequence import SequenceGroup

    seen = {"whole_groups_preempted": 0, "swapped": 0}
    for seed in range(12):
        rng = random.Random(seed)
        sched, kv = make(num_blocks=14, block_size=4, mode=mode, budget=16, max_seqs=8, cpu=10)
        groups, plain, ids = [], [], itertools.count(1000)
        for t in range(4):
            if t % 2 == 0:
                leader = new_seq([t + 2] * rng.randrange(3, 9), t)
                leader.group = SequenceGroup(leader.request_id, 3, [leader])
                sched.add(leader)
                groups.append(leader.group)
            else:
                s = new_seq([t + 2] * rng.randrange(3, 12), t)
                sched.add(s)
                plain.append(s)

        def beam_step(group):
            if group.leader.num_output_tokens >= 8:
                advance(sched, group, BeamStep((), (), True), None)
                groups.remove(group)
                return
            parents = tuple(sorted(rng.randrange(len(group.seqs)) for _ in range(3)))

            def fork(parent):
                child = new_seq(parent.prompt_token_ids, next(ids), rid=parent.request_id)
                child.token_ids, child.group = list(parent.token_ids), group
                child.block_hashes = list(parent.block_hashes)
                sched.fork(parent, child)
                return child

            advance(sched, group, BeamStep(parents, tuple(rng.randrange(2, 60) for _ in parents), False), fork)

        for _ in range(200):
            if not sched.num_unfinished:
                break
            out = step(sched, beam_step)
            assert out.scheduled, "unfinished sequences but an empty step"
            kv.check_invariants()
            for group in groups:
                preempted = [s for s in out.preempted if s.group is group]
                # preempted whole: no beam of it runs on (the admission of waiting ones waits a step)
                assert not preempted or all(s.status is not SequenceStatus.RUNNING for s in group.seqs)
                seen["whole_groups_preempted"] += len(preempted) > 1
                statuses = [s.status for s in group.seqs]
                seen["swapped"] += len(group.seqs) > 1 and statuses.count(SequenceStatus.SWAPPED) == len(statuses)
            for s in list(plain):
                if s.num_output_tokens >= 10:
                    sched.finish(s, "length")
                    plain.remove(s)
        assert not sched.num_unfinished and not groups and not plain
        assert kv.stats().num_free_blocks == 14 and kv.stats().num_free_cpu_blocks == 10
    # the test really preempts groups of several beams (in swap mode, swapping them out whole too)
    assert seen["whole_groups_preempted"] > 0 and (mode == "recompute" or seen["swapped"] > 0), seen


class _GeneralPathOnly(KVCacheManager):
    """The manager with the scheduler's fast path refused: every running sequence takes the general path."""

    def fits_in_place(self, seq, num_new_tokens):
        return False


class _CountingFastPath(KVCacheManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_in_place = 0

    def fits_in_place(self, seq, num_new_tokens):
        fits = super().fits_in_place(seq, num_new_tokens)
        self.num_in_place += fits
        return fits


def _twin(kv_class, mode, num_blocks):
    cfg = SchedulerConfig(max_num_batched_tokens=12, max_num_seqs=6, enable_chunked_prefill=True, preemption_mode=mode)
    kv = kv_class(num_blocks, 4, num_cpu_blocks=6 if mode == "swap" else 0, watermark=0.0)
    return Scheduler(cfg, kv)


def _step_view(sched, out, name):
    """A step's outcome in request terms (seq ids differ between twins): what ran, copied, moved, changed.
    name: seq_id -> (request_id, index) of every sequence the twin ever had."""
    return (
        [(name[it.seq.seq_id], it.num_new_tokens) for it in out.scheduled],
        out.num_batched_tokens,
        out.blocks_to_copy,
        out.blocks_to_swap_out,
        out.blocks_to_swap_in,
        [name[s.seq_id] for s in out.preempted],
        [(name[u.seq_id], u.start, u.block_ids) for u in out.table_deltas.updates],
        sorted(name[i] for i in out.table_deltas.freed_seq_ids),
        sorted((name[i], [b.block_id for b in t]) for i, t in sched.kv.tables.items() if i in name),
    )


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_the_in_place_fast_path_schedules_exactly_as_the_general_path(mode):
    """Twin schedulers, one refusing the fast path, run the same random workload under a tight pool (decodes
    crossing block boundaries, forks whose shared last block is copied on write, shared prefixes,
    preemption, aborts): every step's batch, copies, swaps, table deltas and tables are equal, the fast
    path is taken for most decodes, and no block is left after every request ends."""
    rng = random.Random(5)
    num_copies = 0
    fast, general = _twin(_CountingFastPath, mode, 10), _twin(_GeneralPathOnly, mode, 10)
    live = {fast: {}, general: {}}
    names = {fast: {}, general: {}}
    for t in range(150):
        action = rng.random()
        if action < 0.25 and len(live[fast]) < 8:
            tokens = [1] * rng.choice([0, 4, 6]) + [t % 40 + 2] * rng.randint(1, 9)
            for sched in (fast, general):
                seq = Sequence(
                    request_id=f"r{t}",
                    prompt_token_ids=tokens,
                    params=SamplingParams(max_tokens=8),
                    arrival_time=float(t),
                )
                sched.add(seq)
                live[sched][(seq.request_id, 0)] = seq
                names[sched][seq.seq_id] = (seq.request_id, 0)
        elif action < 0.35:
            forkable = sorted(
                k
                for k, s in live[fast].items()
                if s.status is SequenceStatus.RUNNING and s.num_computed_tokens == s.num_tokens - 1
            )
            if forkable:
                key = rng.choice(forkable)
                for sched in (fast, general):
                    parent = live[sched][key]
                    child = Sequence(
                        request_id=parent.request_id,
                        prompt_token_ids=parent.prompt_token_ids,
                        params=parent.params,
                        arrival_time=parent.arrival_time,
                        index=sum(1 for k in live[sched] if k[0] == key[0]) + t,
                        token_ids=list(parent.token_ids),
                    )
                    child.block_hashes = list(parent.block_hashes)
                    sched.fork(parent, child)
                    live[sched][(child.request_id, child.index)] = child
                    names[sched][child.seq_id] = (child.request_id, child.index)
        elif action < 0.4 and live[fast]:
            key = rng.choice(sorted(live[fast]))
            for sched in (fast, general):
                sched.finish(live[sched].pop(key), "abort")
        views = []
        for sched in (fast, general):
            out = step(sched)
            views.append(_step_view(sched, out, names[sched]))
            for key, s in list(live[sched].items()):
                if s.num_output_tokens >= 12 and not s.is_finished:
                    sched.finish(s, "length")
                    del live[sched][key]
            sched.kv.check_invariants()
        assert views[0] == views[1], f"step {t}"
        num_copies += len(views[0][2])
    for sched in (fast, general):
        for s in live[sched].values():
            sched.finish(s, "abort")
        assert sched.kv.pool.num_used_blocks == 0 and not sched.kv.tables and not sched.kv.swapped
    assert fast.kv.num_in_place > 100 and num_copies > 0 and sum(fast.counters.num_preemptions.values()) > 0


def test_fits_in_place_refuses_a_block_boundary_and_a_shared_block():
    sched, kv = make(num_blocks=8, block_size=4)
    seq = new_seq([2, 3, 4], 0)
    sched.add(seq)
    step(sched)  # 3 prompt tokens computed, 1 sampled: 4 tokens in one block
    assert kv.fits_in_place(seq, 1)  # the 4th slot of its block
    step(sched)  # 5 tokens, 4 computed: the 5th needs a second block
    assert not kv.fits_in_place(seq, 1)
    step(sched)
    assert len(kv.tables[seq.seq_id]) == 2 and kv.fits_in_place(seq, 1)
    child = new_seq(seq.prompt_token_ids, 1, rid=seq.request_id)
    child.token_ids = list(seq.token_ids)
    sched.fork(seq, child)  # its second block is shared now: the next write copies it first
    assert not kv.fits_in_place(seq, 1) and not kv.fits_in_place(child, 1)
    out = step(sched)
    assert len(out.blocks_to_copy) == 1
    kv.check_invariants()
