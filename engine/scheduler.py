"""Iteration-level continuous batching with chunked prefill and preemption.

Pure Python, no torch. Every step:
1. Running sequences, oldest first, get their missing tokens (1 for a decode,
   a chunk of the prompt otherwise) within the token budget. When the pool
   cannot hold a running sequence's next tokens, the latest-arrived running
   sequence is preempted (recompute: its blocks are freed and it goes back to
   the front of the waiting queue, where its prefix may still hit the cache;
   swap: its blocks are copied to the host pool) until it fits, or the
   sequence itself is the latest and is preempted.
2. If nothing was preempted this step, swapped sequences come back, oldest first,
   each with the blocks for its next chunk (a prefill swapped out mid-prompt
   resumes in chunks like any running prefill).
3. If nothing was preempted or is still swapped, waiting sequences are admitted
   FCFS while the budget, max_num_seqs and the pool (minus a watermark) allow.
   The head of the queue blocks those behind it, so no request starves.

The watermark (steps 2 and 3) keeps blocks free for running sequences to grow
into; when nothing runs it is not applied, so any request that fits the pool
(every request does: max_model_len fits it) is admitted, and no queue can stall.
A request with prompt_logprobs takes no prefix-cache hits: its cached
prompt blocks would skip the forward that yields their logits, so the whole
prompt is computed (and counted against the token budget) like an uncached
one; its blocks still enter the cache for others.
A request with n > 1 holds n seats of max_num_seqs from its admission on, the
children it has yet to fork included.

Units: a beam group's running beams (contiguous in `running`) are one unit;
any other sequence is a unit of its own. Step 1 schedules, and preempts,
whole units: a group's beams get their tokens in the same step and are
preempted together (see `SequenceGroup` for how a group waits and resumes).
A group holds beam_width seats from its admission on.

Invariants: a sequence's scheduled tokens never exceed num_tokens -
num_computed_tokens; the sum of scheduled tokens never exceeds
max_num_batched_tokens; at most max_num_seqs sequences run; whenever a
sequence is unfinished, a step schedules something.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from pagedinfer.engine.batch.deltas import TableDeltas
from pagedinfer.engine.kv_cache_manager import KVCacheManager
from pagedinfer.engine.kv_offload.tier import TierCopies
from pagedinfer.engine.scheduler_config import SchedulerConfig
from pagedinfer.engine.sequence import Sequence, SequenceGroup, SequenceStatus


class ScheduledSeq(NamedTuple):
    """One sequence of a step (a named tuple: built for every running sequence every step)."""

    seq: Sequence
    num_new_tokens: int  # tokens computed for seq this step


@dataclass(frozen=True)
class SchedulerOutput:
    """What the model runner executes this step."""

    scheduled: tuple[ScheduledSeq, ...]  # in batch order
    num_batched_tokens: int  # sum of num_new_tokens
    blocks_to_swap_out: tuple[tuple[int, int], ...]  # (device block, host block), copied before the forward
    blocks_to_swap_in: tuple[tuple[int, int], ...]  # (host block, device block), copied before the forward
    blocks_to_copy: tuple[tuple[int, int], ...]  # copy-on-write (src, dst) device blocks
    preempted: tuple[Sequence, ...] = ()  # sequences preempted this step
    # the host tier's copies (engine/kv_offload/): stores (device -> host) run first of all, loads
    # (host -> device) after the swap-ins, both before the forward
    tier_copies: TierCopies = TierCopies()
    # block tables changed since the last non-empty step (never whole tables of unchanged sequences);
    # the runner's persistent batch applies them before the forward (engine/batch/)
    table_deltas: TableDeltas = TableDeltas()

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class RequestCounts:
    """Unfinished requests by state; each request (its sequences share a request_id) is in exactly one."""

    running: int  # at least one of its sequences runs
    waiting: int  # none runs or is swapped: all wait for admission
    swapped: int  # none runs, at least one is swapped out to host memory


@dataclass
class SchedulerCounters:
    num_preemptions: dict[str, int] = field(default_factory=lambda: {"recompute": 0, "swap": 0})
    num_allocation_failures: int = 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        """kv: the pools the scheduler allocates from, and their block size (held there only)."""
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # arrival order: the last is preempted first
        self.swapped: deque[Sequence] = deque()
        self.counters = SchedulerCounters()

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def num_requests(self) -> RequestCounts:
        """Requests, not sequences: n > 1 completions (or a preempted child) never count twice."""
        running = {s.request_id for s in self.running}
        swapped = {s.request_id for s in self.swapped} - running
        waiting = {s.request_id for s in self.waiting} - running - swapped
        return RequestCounts(running=len(running), waiting=len(waiting), swapped=len(swapped))

    # ----- one step ---------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.kv.begin_step()
        budget = self.config.max_num_batched_tokens
        chosen: list[tuple[Sequence, int]] = []
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []
        copies: list[tuple[int, int]] = []
        preempted: list[Sequence] = []

        # 1. running units, oldest first
        running = self.running
        fits_in_place = self.kv.fits_in_place
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            if seq.group is None:
                num_new = seq.num_tokens - seq.num_computed_tokens
                if num_new > budget:
                    num_new = budget
                if num_new <= 0:
                    i += 1
                    continue
                # fast path (most decodes): the table already holds the slots, so `allocate` would do
                # nothing and the pool's room is never asked; exactly the general path's outcome
                if fits_in_place(seq, num_new):
                    chosen.append((seq, num_new))
                    budget -= num_new
                    i += 1
                    continue
            unit = self._unit_at(i)
            writes = []
            for seq in unit:
                num_new = min(seq.num_tokens - seq.num_computed_tokens, budget - sum(n for _, n in writes))
                if num_new > 0:
                    writes.append((seq, num_new))
            if not writes:
                i += len(unit)
                continue
            while not self.kv.can_allocate_all(writes):
                victims = self._unit_at(len(self.running) - 1, last=True)
                self._preempt(victims, swap_out)
                preempted.extend(victims)
                if victims[0] is unit[0]:
                    break
            if unit[0].status is not SequenceStatus.RUNNING:
                break  # the unit itself was the last one and got preempted
            for seq, num_new in writes:
                copies.extend(self.kv.allocate(seq, num_new))
                chosen.append((seq, num_new))
                budget -= num_new
            i += len(unit)

        # 2. swapped sequences come back when nothing was preempted; a prefill swapped out
        #    mid-prompt comes back with a chunk of its rest, as a running prefill would
        # seats of max_num_seqs held by running sequences (steps 2 and 3 only add to them)
        seats_taken = sum(self.seats(s) for s in self.running) if self.swapped or self.waiting else 0
        if not preempted:
            while self.swapped and budget > 0:
                seq = self.swapped[0]
                if seats_taken + self.seats(seq) > self.config.max_num_seqs:
                    break
                unit = [seq] if seq.group is None else [s for s in seq.group.seqs if s.status is SequenceStatus.SWAPPED]
                writes = []
                for member in unit:
                    writes.append(
                        (
                            member,
                            min(member.num_tokens - member.num_computed_tokens, budget - sum(n for _, n in writes)),
                        )
                    )
                if not self.kv.can_swap_in(writes, use_watermark=bool(self.running)):
                    break
                self.swapped.popleft()
                swap_in.extend(self.kv.swap_in(*unit))
                seats_taken += self.seats(seq)
                for member, num_new in writes:
                    copies.extend(self.kv.allocate(member, num_new))
                    member.status = SequenceStatus.RUNNING
                    self.running.append(member)
                    if num_new > 0:
                        chosen.append((member, num_new))
                        budget -= num_new

        # 3. admit waiting sequences, FCFS
        if not preempted and not self.swapped:
            while self.waiting and budget > 0:
                seq = self.waiting[0]
                if seats_taken + self.seats(seq) > self.config.max_num_seqs:
                    break
                # a request for prompt logprobs needs every prompt position's logits: no prefix-cache hits
                reuse = seq.num_computed_tokens == 0 and seq.params.prompt_logprobs is None
                hits = self.kv.get_computed_blocks(seq) if reuse else []
                num_hit_tokens = len(hits) * self.kv.block_size
                num_tier_hit_tokens = self.kv.num_tier_hits(hits) * self.kv.block_size if hits else 0
                remaining = seq.num_tokens - seq.num_computed_tokens - num_hit_tokens
                if not self.config.enable_chunked_prefill and remaining > budget:
                    break
                num_new = min(remaining, budget)
                # the watermark keeps room for running sequences to grow; with none running,
                # any request that fits the pool (max_model_len does) must be admitted
                if not self.kv.can_allocate(seq, num_new, hits, use_watermark=bool(self.running)):
                    self.counters.num_allocation_failures += 1
                    break
                self.waiting.popleft()
                copies.extend(self.kv.allocate(seq, num_new, hits))
                self.kv.record_admission(
                    seq, num_hit_tokens, readmitted=seq.was_admitted, num_tier_hit_tokens=num_tier_hit_tokens
                )
                if not seq.was_admitted:
                    seq.num_cached_tokens = num_hit_tokens
                    seq.was_admitted = True
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                seats_taken += self.seats(seq)
                chosen.append((seq, num_new))
                budget -= num_new

        return SchedulerOutput(
            scheduled=tuple(map(ScheduledSeq._make, chosen)),
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
            blocks_to_swap_out=tuple(swap_out),
            blocks_to_swap_in=tuple(swap_in),
            blocks_to_copy=tuple(copies),
            preempted=tuple(preempted),
            # an empty step runs nothing: its changes stay pending for the next step that runs
            table_deltas=self.kv.take_table_deltas() if chosen else TableDeltas(),
            tier_copies=self.kv.take_tier_copies() if chosen else TierCopies(),
        )

    @staticmethod
    def seats(seq: Sequence) -> int:
        """Running slots a queued or running sequence holds: itself and the children it will fork
        (n > 1); a beam group's leader holds the group's beam_width, its other beams none."""
        if seq.group is not None:
            return seq.group.beam_width if seq is seq.group.leader else 0
        return 1 + seq.num_forks_pending

    def _unit_at(self, index: int, last: bool = False) -> list[Sequence]:
        """The unit running[index] belongs to: it alone, or its group's beams around it (contiguous).

        `last`: index is the unit's last position (walk back), else its first (walk on)."""
        group = self.running[index].group
        if group is None:
            return [self.running[index]]
        start = end = index
        if last:
            while start > 0 and self.running[start - 1].group is group:
                start -= 1
        else:
            while end + 1 < len(self.running) and self.running[end + 1].group is group:
                end += 1
        return self.running[start : end + 1]

    def _preempt(self, unit: list[Sequence], swap_out: list[tuple[int, int]]) -> None:
        """Preempt a unit: swap it out whole, or free it for recompute. Only its leader is queued."""
        for seq in unit:
            self.running.remove(seq)
        leader = unit[0] if unit[0].group is None else unit[0].group.leader
        if self.config.preemption_mode == "swap" and self.kv.can_swap_out(*unit):
            swap_out.extend(self.kv.swap_out(*unit))
            for seq in unit:
                seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(leader)
            self.counters.num_preemptions["swap"] += 1
            return
        for seq in unit:
            self.kv.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING  # a group's other beams are parked (see SequenceGroup)
        self.waiting.appendleft(leader)
        self.counters.num_preemptions["recompute"] += 1

    # ----- bookkeeping after the forward -------------------------------------------------
    def after_step(self, output: SchedulerOutput) -> None:
        """Advance computed tokens and register newly full blocks in the prefix cache (a sequence ending in an
        async-scheduling placeholder registers them once the placeholder's id is known: engine/async_step/)."""
        running = SequenceStatus.RUNNING
        cache_computed_blocks = self.kv.cache_computed_blocks
        for seq, num_new_tokens in output.scheduled:
            if seq.status is not running:
                continue
            seq.num_computed_tokens += num_new_tokens
            if not seq.num_placeholders:
                cache_computed_blocks(seq)
            group = seq.group
            if group is not None and seq is group.leader and seq.num_computed_tokens == seq.num_tokens:
                self._unpark(group)

    def _unpark(self, group: SequenceGroup) -> None:
        """Fork a recomputed leader's parked beams again, each sharing their common prefix with it."""
        leader = group.leader
        at = self.running.index(leader) + 1
        for seq in group.seqs[1:]:
            if seq.status is not SequenceStatus.WAITING:
                continue
            common = 0
            for a, b in zip(leader.token_ids, seq.token_ids):
                if a != b:
                    break
                common += 1
            common = min(common, seq.num_tokens - 1)  # the beam computes at least its last token
            self.kv.fork(leader, seq, num_tokens=common)
            seq.num_computed_tokens = common
            seq.status = SequenceStatus.RUNNING
            self.running.insert(at, seq)
            at += 1

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Start child as a running copy of parent sharing its blocks (n > 1)."""
        self.kv.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.was_admitted = True
        child.status = SequenceStatus.RUNNING
        self.running.insert(self.running.index(parent) + 1, child)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Stop seq (finished or aborted) and free its blocks at once; tokens async scheduling scheduled past its
        end (placeholders) are dropped."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.num_placeholders:
            del seq.token_ids[-seq.num_placeholders :]
            seq.num_placeholders = 0
        queue = {
            SequenceStatus.RUNNING: self.running,
            SequenceStatus.WAITING: self.waiting,
            SequenceStatus.SWAPPED: self.swapped,
        }.get(seq.status)
        if queue is not None and seq in queue:  # a step that raised may have left seq between queues
            queue.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
