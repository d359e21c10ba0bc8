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

Invariants: a sequence's scheduled tokens never exceed num_tokens -
num_computed_tokens; the sum of scheduled tokens never exceeds
max_num_batched_tokens; at most max_num_seqs sequences run; whenever a
sequence is unfinished, a step schedules something.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pagedinfer.engine.config import EngineConfig
from pagedinfer.engine.kv_cache_manager import KVCacheManager
from pagedinfer.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed for seq this step
    block_ids: tuple[int, ...]  # seq's block table after allocation


@dataclass(frozen=True)
class SchedulerOutput:
    """What the model runner executes this step."""

    scheduled: tuple[ScheduledSeq, ...]  # in batch order
    num_batched_tokens: int  # sum of num_new_tokens
    blocks_to_swap_out: tuple[tuple[int, int], ...]  # (device block, host block), copied before the forward
    blocks_to_swap_in: tuple[tuple[int, int], ...]  # (host block, device block), copied before the forward
    blocks_to_copy: tuple[tuple[int, int], ...]  # copy-on-write (src, dst) device blocks
    preempted: tuple[Sequence, ...] = ()  # sequences preempted this step

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerCounters:
    num_preemptions: dict[str, int] = field(default_factory=lambda: {"recompute": 0, "swap": 0})
    num_allocation_failures: int = 0


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
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

    # ----- one step ---------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chosen: list[tuple[Sequence, int]] = []
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []
        copies: list[tuple[int, int]] = []
        preempted: list[Sequence] = []

        # 1. running sequences, oldest first
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while not self.kv.can_allocate(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, swap_out)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # seq itself was the last one and got preempted
            copies.extend(self.kv.allocate(seq, num_new))
            chosen.append((seq, num_new))
            budget -= num_new
            i += 1

        # 2. swapped sequences come back when nothing was preempted; a prefill swapped out
        #    mid-prompt comes back with a chunk of its rest, as a running prefill would
        # seats of max_num_seqs held by running sequences (steps 2 and 3 only add to them)
        seats_taken = sum(self._seats(s) for s in self.running)
        if not preempted:
            while self.swapped and budget > 0:
                seq = self.swapped[0]
                if seats_taken + self._seats(seq) > self.config.max_num_seqs:
                    break
                num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
                if not self.kv.can_swap_in(seq, num_new, use_watermark=bool(self.running)):
                    break
                self.swapped.popleft()
                swap_in.extend(self.kv.swap_in(seq))
                copies.extend(self.kv.allocate(seq, num_new))
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                seats_taken += self._seats(seq)
                chosen.append((seq, num_new))
                budget -= num_new

        # 3. admit waiting sequences, FCFS
        if not preempted and not self.swapped:
            while self.waiting and budget > 0:
                seq = self.waiting[0]
                if seats_taken + self._seats(seq) > self.config.max_num_seqs:
                    break
                # a request for prompt logprobs needs every prompt position's logits: no prefix-cache hits
                reuse = seq.num_computed_tokens == 0 and seq.params.prompt_logprobs is None
                hits = self.kv.get_computed_blocks(seq) if reuse else []
                num_hit_tokens = len(hits) * self.kv.block_size
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
                if not seq.was_admitted:
                    seq.num_cached_tokens = num_hit_tokens
                    seq.was_admitted = True
                self.kv.record_admission(seq, num_hit_tokens)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                seats_taken += self._seats(seq)
                chosen.append((seq, num_new))
                budget -= num_new

        scheduled = tuple(ScheduledSeq(s, n, tuple(self.kv.block_ids(s))) for s, n in chosen)
        return SchedulerOutput(
            scheduled=scheduled,
            num_batched_tokens=sum(n for _, n in chosen),
            blocks_to_swap_out=tuple(swap_out),
            blocks_to_swap_in=tuple(swap_in),
            blocks_to_copy=tuple(copies),
            preempted=tuple(preempted),
        )

    @staticmethod
    def _seats(seq: Sequence) -> int:
        """Running slots a sequence holds: itself and the children it will fork (n > 1)."""
        return 1 + seq.num_forks_pending

    def _preempt(self, seq: Sequence, swap_out: list[tuple[int, int]]) -> None:
        self.running.remove(seq)
        if self.config.preemption_mode == "swap" and self.kv.can_swap_out(seq):
            swap_out.extend(self.kv.swap_out(seq))
            seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(seq)
            self.counters.num_preemptions["swap"] += 1
            return
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.counters.num_preemptions["recompute"] += 1

    # ----- bookkeeping after the forward -------------------------------------------------
    def after_step(self, output: SchedulerOutput) -> None:
        """Advance computed tokens and register newly full blocks in the prefix cache."""
        for item in output.scheduled:
            seq = item.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens += item.num_new_tokens
            self.kv.cache_computed_blocks(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Start child as a running copy of parent sharing its blocks (n > 1)."""
        self.kv.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.was_admitted = True
        child.status = SequenceStatus.RUNNING
        self.running.insert(self.running.index(parent) + 1, child)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Stop seq (finished or aborted) and free its blocks at once."""
        if seq.status is SequenceStatus.FINISHED:
            return
        queue = {SequenceStatus.RUNNING: self.running, SequenceStatus.WAITING: self.waiting,
                 SequenceStatus.SWAPPED: self.swapped}.get(seq.status)
        if queue is not None and seq in queue:  # a step that raised may have left seq between queues
            queue.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
