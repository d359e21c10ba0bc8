"""The asynchronously scheduled step: schedule step N+1 and process step N-1 while step N's forward runs.

One `step()` call (`LLMEngine.step`/`step_deltas` with `--async-scheduling`):
1. schedule the next job (the scheduler sees every sequence that samples in
   the job in flight as one token longer: a placeholder, `PLACEHOLDER`, at
   the end of its token_ids, `Sequence.num_placeholders`), prepare its inputs
   on this thread, advance its computed tokens, give each of its sampling
   sequences a placeholder of its own, and queue it on the forward thread;
2. wait for the job in flight's logits, sample them (here: the sampler's
   state is this thread's) and hand the tokens, as a tensor on the device, to
   the queued job, which writes them over its placeholders just before its
   forward (`forward_thread.Handover`). A job whose every sampling row is
   plain greedy (`SamplingParams.argmax_only`, no grammar) takes its argmax
   on the forward thread right after its forward, and the next job reads its
   placeholders' ids from that tensor: nothing of this thread's lies between
   the two forwards (the argmax of a row finished meanwhile is never used);
3. turn those tokens into outputs exactly as the synchronous step does
   (`LLMEngine._append_token`: a placeholder's id is replaced, the cheap
   finishes end the sequence and free its blocks; text and stop strings
   inline or on the output side), while the queued job's forward runs.
A call returns the outputs of the job it finished, one step later than the
synchronous engine; the first call of a run returns none.

What a client sees is what it sees without async scheduling. A sequence that
finished at step N (EOS, a stop token or string, an abort) had one more token
scheduled in step N+1: that row is computed and never sampled, its
placeholder dropped (`Scheduler.finish`), its blocks freed when it finished
(the forward thread writes a freed block only before any later job that
reuses it). A sequence whose next token is its last by length gets no
placeholder, so it is not scheduled again. Prefix-cache blocks of a sequence
are registered only once their tokens are known (`Scheduler.after_step`).

Falls back to the synchronous step (`can_run_ahead`) while a request of
`eligibility.sync_reason` is in the engine: the job in flight is finished
first, then steps run as without the option.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import torch

from pagedinfer.engine.async_step.eligibility import sync_reason
from pagedinfer.engine.async_step.forward_thread import ForwardThread, Handover, Job
from pagedinfer.engine.runner.inputs import PreparedStep, prepare_step
from pagedinfer.engine.sampler import SampleResult
from pagedinfer.engine.sequence import Sequence

if TYPE_CHECKING:
    from pagedinfer.engine.llm_engine import LLMEngine

PLACEHOLDER = -1  # a scheduled token whose id is not sampled yet (never reaches the model: the hand-over replaces it)


@dataclass
class _InFlight:
    """A job on the forward thread."""

    job: Job
    prepared: PreparedStep
    sampling: dict[int, Sequence]  # seq_id -> the sequences that sample in it
    fills: list[tuple[int, int]]  # (flat input index, seq_id): its placeholders, from the previous job's tokens
    tokens: Handover  # this job's sampled tokens, for the next job's placeholders (a job sampled here)
    greedy: bool  # every sampling row plain greedy: the forward thread takes the argmax (job.value[1])


class AsyncStepper:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.thread = ForwardThread()
        self.in_flight: _InFlight | None = None
        self._sync_requests: dict[str, Any] = {}  # request_id -> its EngineRequest, while it is in the engine

    # ----- when ----------------------------------------------------------------------
    def on_request(self, req: Any) -> None:
        """A request was added: note it if it keeps the engine synchronous."""
        if sync_reason(req.params) is not None:
            self._sync_requests[req.request_id] = req

    def can_run_ahead(self) -> bool:
        """No request in the engine needs the synchronous step."""
        if self._sync_requests:
            requests = self.engine.requests
            self._sync_requests = {rid: req for rid, req in self._sync_requests.items() if requests.get(rid) is req}
        return not self._sync_requests

    def engaged(self) -> bool:
        """This step is the stepper's: a job is in flight, or the next may run ahead."""
        return self.in_flight is not None or self.can_run_ahead()

    def shutdown(self) -> None:
        pending = (self.in_flight.tokens,) if self.in_flight is not None else ()
        self.thread.shutdown(pending)

    # ----- one step --------------------------------------------------------------------
    def step(self, cumulative: bool) -> list:
        previous, launched = self.in_flight, None
        try:
            if self.can_run_ahead():
                launched = self._launch(previous)
            self.in_flight = launched
            if previous is None:
                return [] if launched is not None else self.engine._nothing_scheduled()
            return self._finish(previous, launched, cumulative)
        except BaseException:
            for job in (previous, launched):  # the engine has failed: no job may wait for tokens
                if job is not None:
                    job.tokens.cancel()
            self.in_flight = None
            raise

    def _launch(self, previous: _InFlight | None) -> _InFlight | None:
        """Schedule, prepare and queue the next job (its placeholders filled from `previous`' tokens)."""
        e = self.engine
        sched = e.scheduler.schedule()
        if sched.is_empty:
            return None
        sampling, _, num_prompt_tokens = e._scan(sched)  # no prompt-logprob request runs ahead
        prepared = prepare_step(sched, {s.seq_id for s in sampling})
        fills: list[tuple[int, int]] = []  # (flat input index, seq_id)
        if previous is not None:
            inputs = prepared.inputs
            flat_start = dict(zip(inputs.seq_ids, accumulate(inputs.query_lens, initial=0)))
            for seq, num_new in sched.scheduled:
                if seq.num_placeholders:  # the one of `previous` (later ones are appended below)
                    position = len(seq.token_ids) - seq.num_placeholders
                    start = seq.num_computed_tokens
                    if position < start + num_new:
                        fills.append((flat_start[seq.seq_id] + position - start, seq.seq_id))
        e.scheduler.after_step(sched)  # computed as of this job: the next schedule builds on it
        e.num_prompt_tokens += num_prompt_tokens
        max_model_len = e.max_model_len
        for seq in sampling:
            # a token that will be the sequence's last by length gets no placeholder: nothing follows it
            if len(seq.token_ids) + 1 < min(seq.max_num_tokens, max_model_len):
                seq.token_ids.append(PLACEHOLDER)
                seq.num_placeholders += 1
        fill = None
        if fills:
            fill = self._argmax_fill(previous, fills) if previous.greedy else previous.tokens.fill
        greedy = all(s.params.argmax_only and s.grammar is None for s in sampling)
        runner, num_sampled = e.runner, len(prepared.sampled_seq_ids)

        def run():
            logits = runner.run_step(prepared.inputs, fill)
            return logits, logits[:num_sampled].argmax(dim=-1) if greedy else None

        job = Job(run)
        launched = _InFlight(job, prepared, {s.seq_id: s for s in sampling}, fills, Handover(), greedy)
        self.thread.submit(job)
        return launched

    def _finish(self, done: _InFlight, following: _InFlight | None, cumulative: bool) -> list:
        """Sample `done`'s logits, hand its tokens to `following`, and make `done`'s outputs."""
        e = self.engine
        raw_logits, argmax = self.thread.wait(done.job)
        logits, row_ids, _ = done.prepared.split(raw_logits)
        # a row of a sequence finished since the job was scheduled is computed and never sampled
        row_index = [r for r, seq_id in enumerate(row_ids) if not done.sampling[seq_id].is_finished]
        rows = [done.sampling[row_ids[r]] for r in row_index]

        def hand_over(tokens: torch.Tensor) -> None:
            self._hand_over(done, following, rows, tokens)

        if done.greedy:  # sampled on the forward thread; the next job read its placeholders from there
            tokens = argmax.tolist()
            results = [SampleResult(tokens[r], None) for r in row_index]
        elif rows:
            every_row = len(row_index) == logits.shape[0]
            results = e.sampler.sample(
                logits if every_row else logits[torch.tensor(row_index, device=logits.device)], rows, hand_over
            )
        else:
            results = []
        if not done.tokens.given:
            hand_over(torch.empty(0, dtype=torch.long, device=logits.device))
        # the output side's result for the job before: its stop strings end their sequences now
        previous = e.output_side.take_previous()
        touched: dict[str, Any] = {}
        items = []
        now = time.monotonic()
        cache_computed_blocks = e.kv.cache_computed_blocks
        for seq, res in zip(rows, results):
            if seq.is_finished:  # a stop string of the job before ended it
                continue
            req = e.requests[seq.request_id]
            items.append(e._append_token(req, seq, res.token_id, res.logprobs, now))
            touched[req.request_id] = req
            if not seq.is_finished:
                cache_computed_blocks(seq)  # its blocks up to the token just known
        return e.output_side.emit(items, touched, previous, cumulative)

    def _argmax_fill(self, previous: _InFlight, fills: list[tuple[int, int]]):
        """The fill of a job whose placeholders come from a greedy job's argmax (read on the forward thread, after
        that job ran: its own `job.value`)."""
        row_of = {seq_id: r for r, seq_id in enumerate(previous.prepared.sampled_seq_ids)}
        device = self.engine.runner.device
        positions = torch.tensor([flat for flat, _ in fills], device=device)
        source = torch.tensor([row_of[seq_id] for _, seq_id in fills], device=device)

        def fill(input_ids: torch.Tensor) -> None:
            input_ids[positions] = previous.job.value[1][source]

        return fill

    def _hand_over(
        self, done: _InFlight, following: _InFlight | None, rows: list[Sequence], tokens: torch.Tensor
    ) -> None:
        """Give `following` the ids of its placeholders from `done`'s tokens (rows' order), on their device."""
        if following is None or not following.fills or done.greedy:  # greedy: it reads `done`'s argmax
            done.tokens.give()
            return
        row_of = {seq.seq_id: r for r, seq in enumerate(rows)}
        missing = len(rows)  # a sequence finished before sampling: its row is never used, any id will do
        device = tokens.device
        source = torch.tensor([row_of.get(seq_id, missing) for _, seq_id in following.fills], device=device)
        padded = torch.cat([tokens.to(torch.long), torch.zeros(1, dtype=torch.long, device=device)])
        done.tokens.give(torch.tensor([flat for flat, _ in following.fills], device=device), padded[source])
