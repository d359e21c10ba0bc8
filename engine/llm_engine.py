"""LLMEngine: requests in, one scheduler step at a time, outputs out.

Not thread-safe: one thread owns the engine (the server's engine loop, or
LLM.generate). A step is: schedule -> block copies + one packed forward ->
advance computed tokens (and cache full blocks) -> fork n>1 requests whose
prompt just finished (`fork`) -> sample -> append token ids and end sequences on the
finishes that need no text (`stop_checks.py`: EOS, stop tokens, grammar, length), freeing their
blocks at once -> the step's `OutputBatch` to the output side (`engine/overlap/side.py`: detokenize, stop
strings, outputs). Requests are checked before they are queued (`request_checks.py`). With `EngineConfig.overlap` "thread" or "process" that batch runs on the output
thread (or in the output process) during the next step's forward, whose step returns its outputs (one
step later) and ends the sequences its stop strings ended, dropping the token
sampled for them meanwhile; without it the batch runs inline. Beam-search requests (`BeamSearchParams`)
skip the sampler: their rows go to their search (`engine/beam/group.py`). With `EngineConfig.async_scheduling`
the step is `engine/async_step/`'s: the next step is scheduled and this one's outputs made while a forward runs
on the forward thread (falling back to the step here where that cannot apply).

Outputs: `step_deltas()` returns only what each touched request gained this
step (`RequestOutputDelta`: new tokens, logprobs and text, finish), so a
consumer pays once per token; `OutputAccumulator` assembles the RequestOutput
from them. `step()` returns the cumulative RequestOutputs as before (a copy of
every token so far, per step: for callers that keep each step's outputs).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.config.host_memory import available_host_memory
from pagedinfer.engine import engine_setup as setup
from pagedinfer.engine.beam import group as beam_group
from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.kv_cache_manager import KVCacheManager
from pagedinfer.engine.outputs import (
    CompletionOutput,
    EngineStats,
    RequestMetrics,
    RequestOutput,
    RequestOutputDelta,
)
from pagedinfer.engine.overlap.side import OutputSide
from pagedinfer.engine.overlap.text import TokenItem
from pagedinfer.engine.request_checks import check_request, check_request_id, prompt_token_ids
from pagedinfer.engine.request_state import EngineRequest
from pagedinfer.engine.runner.profiling import size_kv_cache
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.scheduler import Scheduler
from pagedinfer.engine.scheduler_config import SchedulerConfig
from pagedinfer.engine.sequence import Sequence
from pagedinfer.engine.stop_checks import check_stop
from pagedinfer.engine.structured.compiler import StructuredOutputs

if TYPE_CHECKING:
    from pagedinfer.engine.async_step.stepper import AsyncStepper


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        """Build the engine in the steps of `engine_setup.py`; a failure stops any tensor-parallel rank started."""
        from pagedinfer.engine.distributed.launch import create_runner

        self.config = config = setup.resolve_model_paths(config)
        self.output_side: OutputSide | None = None  # built after the runner
        self._async: AsyncStepper | None = None  # async scheduling (engine/async_step/); None: steps are synchronous
        self.runner = create_runner(config)  # first: a bad model is named as the model
        try:
            self._init_after_runner(config)
        except BaseException:
            self.shutdown()
            raise

    def _init_after_runner(self, config: EngineConfig) -> None:
        from pagedinfer.engine.sampler import Sampler

        self.tokenizer = setup.load_tokenizer(config.tokenizer or config.model)
        self.max_model_len = setup.resolve_max_model_len(config, self.runner.max_position_embeddings)
        self.sizing = size_kv_cache(self.runner, self.max_model_len)
        self.bytes_per_block = self.sizing.bytes_per_block
        self.num_gpu_blocks, self.num_cpu_blocks, self.num_tier_blocks = setup.kv_pools(
            config, self.sizing, self.max_model_len, self.runner.device.type, available_host_memory()
        )
        self.runner.allocate_kv_cache(self.num_gpu_blocks, self.num_cpu_blocks)
        self.kv = KVCacheManager(
            self.num_gpu_blocks,
            config.block_size,
            self.num_cpu_blocks,
            config.enable_prefix_caching,
            config.watermark,
            enable_offload=self.num_tier_blocks > 0,
        )
        self.scheduler = Scheduler(SchedulerConfig.of(config), self.kv)
        self.eos_token_ids = setup.eos_token_ids(
            getattr(self.runner.model.generation_config, "eos_token_id", None), self.tokenizer.eos_token_id
        )
        self.sampler = Sampler(config.seed, self.eos_token_ids, self.runner.device)
        self.structured = StructuredOutputs(self.tokenizer, self.runner.vocab_size, self.eos_token_ids)
        self.requests: dict[str, EngineRequest] = {}
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.output_side = OutputSide(
            config.overlap, str(config.tokenizer or config.model), self.tokenizer, self.requests, self._end
        )
        if config.async_scheduling and self.runner.workers is None and not config.compile:
            from pagedinfer.engine.async_step.stepper import AsyncStepper

            self._async = AsyncStepper(self)

    def warm_up_structured_outputs(self) -> None:
        """Do the grammar backend's one-time set-up now (a server, before it reports healthy), not in a step."""
        self.structured.warm_up()
        self.sampler.grammar_bitmask.warm_up()

    # ----- requests ---------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt, validated (`request_checks.prompt_token_ids`)."""
        return prompt_token_ids(prompt, self.tokenizer, self.runner.vocab_size)

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams | BeamSearchParams) -> None:
        """Raise ValueError (naming the parameter) if the request can never run (`request_checks.py`)."""
        check_request(
            prompt_token_ids,
            params,
            max_model_len=self.max_model_len,
            vocab_size=self.runner.vocab_size,
            max_num_seqs=self.config.max_num_seqs,
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.config.block_size,
        )

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | BeamSearchParams,
        arrival_time: float | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        """Queue a request. `prompt_token_ids`, when given, are `tokenize(prompt)` already computed."""
        check_request_id(request_id, self.requests)
        ids = self.tokenize(prompt if prompt_token_ids is None else prompt_token_ids)
        self.check_request(ids, params)
        now = arrival_time if arrival_time is not None else time.monotonic()
        req = EngineRequest(request_id, prompt if isinstance(prompt, str) else None, ids, params, RequestMetrics(now))
        if isinstance(params, BeamSearchParams):
            self._admit(req, beam_group.start(req, params, self.eos_token_ids))
            return
        req.outputs = [
            CompletionOutput(index=i, logprobs=[] if params.logprobs is not None else None) for i in range(params.n)
        ]
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None] * len(ids)
        seq = Sequence(
            request_id=request_id, prompt_token_ids=ids, params=params, arrival_time=now, prompt=req.prompt, index=0
        )
        seq.num_forks_pending = params.n - 1
        seq.detok = self.output_side.detokenizer(ids, params.skip_special_tokens)
        if params.structured_outputs is not None:
            seq.grammar = self.structured.matcher_for(params.structured_outputs)  # compiled: a cache hit
        req.seqs.append(seq)
        self._admit(req, seq)

    def _admit(self, req: EngineRequest, seq: Sequence) -> None:
        self.requests[req.request_id] = req
        self.scheduler.add(seq)
        if self._async is not None:
            self._async.on_request(req)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Stop the request(s) now and free their blocks; unknown ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            req.aborted = True
            self.output_side.forget(req)
            for seq in req.live_seqs:
                self._end(seq, "abort")

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def check_health(self) -> None:
        """Raise (naming the rank) if a rank of a tensor-parallel replica has failed; cheap, never blocks."""
        if self.runner.workers is not None:
            self.runner.workers.check()

    def shutdown(self) -> None:
        """Stop the output thread or process and the other ranks of a tensor-parallel replica (idempotent)."""
        if self.output_side is not None:
            self.output_side.shutdown()
        if self._async is not None:
            self._async.shutdown()
        if getattr(self, "runner", None) is not None and self.runner.workers is not None:
            self.runner.workers.shutdown()

    # ----- one step ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step; the cumulative output of every request it touched."""
        return self._step(cumulative=True)

    def step_deltas(self) -> list[RequestOutputDelta]:
        """One step; what every request it touched gained (see the module docstring)."""
        return self._step(cumulative=False)

    def _step(self, cumulative: bool) -> list:
        if self._async is not None and self._async.engaged():
            return self._async.step(cumulative)
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return self._nothing_scheduled()
        sampling, prompt_rows, num_prompt_tokens = self._scan(sched)
        # the grammar masks of this step's constrained rows are computed while the forward runs
        self.sampler.grammar_bitmask.prefetch(
            [s.grammar for s in sampling if s.grammar is not None], self.runner.vocab_size, self.runner.device
        )
        logits, row_ids, prompt_logits = self.runner.execute(sched, {s.seq_id for s in sampling}, prompt_rows)
        if prompt_logits:
            from pagedinfer.engine.prompt_logprobs import record_prompt_logprobs

            record_prompt_logprobs(sched, prompt_logits, self.requests, self.tokenizer)
        self.scheduler.after_step(sched)
        self.num_prompt_tokens += num_prompt_tokens
        # with overlap: the previous step's outputs, made while this forward ran; its stop strings end their
        # sequences now, and the tokens this step computed for them are never sampled
        previous = self.output_side.take_previous()
        by_id = {s.seq_id: s for s in sampling}
        all_rows = [by_id[i] for i in row_ids]
        row_index = [r for r, seq in enumerate(all_rows) if seq.group is None and not seq.is_finished]
        rows = [all_rows[r] for r in row_index]
        for r, seq in zip(list(row_index), list(rows)):
            while seq.num_forks_pending:
                rows.append(self.fork(seq))
                row_index.append(r)
        if rows:
            import torch

            # the common step samples every row once, in order: no gather (the sampler copies the rows it writes)
            every_row = len(row_index) == logits.shape[0] and row_index == list(range(len(row_index)))
            results = self.sampler.sample(
                logits if every_row else logits[torch.tensor(row_index, device=logits.device)], rows
            )
        else:
            results = []
        touched: dict[str, EngineRequest] = {}
        now = time.monotonic()
        beam_rows = [r for r, seq in enumerate(all_rows) if seq.group is not None]
        if beam_rows:
            beam_seqs = [all_rows[r] for r in beam_rows]
            finished, num_beam_tokens = beam_group.step_beams(
                logits, beam_rows, beam_seqs, self.requests, self.scheduler, self.fork, self.tokenizer, now
            )
            self.num_generation_tokens += num_beam_tokens
            touched.update((req.request_id, req) for req in finished)
        items = []
        for seq, res in zip(rows, results):
            req = self.requests[seq.request_id]
            items.append(self._append_token(req, seq, res.token_id, res.logprobs, now))
            touched[req.request_id] = req
        return self.output_side.emit(items, touched, previous, cumulative)

    def _nothing_scheduled(self) -> list:
        """A step the scheduler gave nothing to: the output side's last outputs, or an error if it stalled."""
        if self.output_side.in_flight:  # the last step's outputs
            return self.output_side.collect(self.output_side.take_previous())
        if self.scheduler.num_unfinished:  # the scheduler promises progress: say so rather than spin
            kv = self.kv.stats()
            raise RuntimeError(
                f"scheduler stalled: {len(self.scheduler.waiting)} waiting, {len(self.scheduler.swapped)} "
                f"swapped, {len(self.scheduler.running)} running, {kv.num_free_blocks} of "
                f"{self.num_gpu_blocks} blocks free"
            )
        return []

    def _scan(self, sched) -> tuple[list[Sequence], set[int], int]:
        """One pass over a schedule: first-scheduled times, then the rows that sample (a sequence whose last token
        is computed this step samples a new token), the prompt-logprob rows and the prompt tokens computed."""
        now = time.monotonic()
        sampling: list[Sequence] = []
        prompt_rows: set[int] = set()
        num_prompt_tokens = 0
        for seq, num_new in sched.scheduled:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
                req = self.requests[seq.request_id]
                if req.metrics.first_scheduled_time is None:
                    req.metrics.first_scheduled_time = now
            computed = seq.num_computed_tokens
            if computed + num_new == len(seq.token_ids):
                sampling.append(seq)
            num_prompt = len(seq.prompt_token_ids)
            if computed < num_prompt:
                num_prompt_tokens += min(num_prompt - computed, num_new)
                if seq.params.prompt_logprobs is not None and computed < num_prompt - 1:
                    prompt_rows.add(seq.seq_id)
        return sampling, prompt_rows, num_prompt_tokens

    def fork(self, parent: Sequence) -> Sequence:
        """A running sequence sharing all of parent's blocks and tokens (before either appends its next token): a
        new beam of parent's group, or else parent's next pending completion (n > 1: its own detokenizer and
        grammar matcher; parent.num_forks_pending drops by one)."""
        req = self.requests[parent.request_id]
        p = parent.params
        child = Sequence(
            request_id=parent.request_id,
            prompt_token_ids=parent.prompt_token_ids,
            params=p,
            arrival_time=parent.arrival_time,
            prompt=parent.prompt,
            index=0 if parent.group is not None else len(req.seqs),
            token_ids=list(parent.token_ids),
            group=parent.group,
        )
        child.block_hashes = list(parent.block_hashes)
        child.first_scheduled_time = parent.first_scheduled_time
        if parent.group is None:
            child.detok = self.output_side.detokenizer(parent.prompt_token_ids, p.skip_special_tokens)
            # a fresh matcher, not a copy of the parent's: the grammar thread may still be filling this step's
            # masks, and llguidance holds each matcher it fills borrowed (the parent has consumed nothing yet)
            child.grammar = self.structured.matcher_for(p.structured_outputs) if parent.grammar is not None else None
            req.seqs.append(child)
            parent.num_forks_pending -= 1
        self.scheduler.fork(parent, child)
        return child

    def _append_token(self, req: EngineRequest, seq: Sequence, token: int, logprobs, now: float) -> TokenItem:
        """The engine's half of a new token: its id, and the finishes that need no text (`stop_checks.py`: the
        sequence ends, its blocks freed, at once). Its text, stop strings and output are `overlap/text.py`'s."""
        token_ids = seq.token_ids
        if seq.num_placeholders:  # async scheduling scheduled it already: its id replaces the placeholder
            token_ids[-seq.num_placeholders] = token
            seq.num_placeholders -= 1
        else:
            token_ids.append(token)
        num_tokens = len(token_ids) - seq.num_placeholders
        num_output_tokens = num_tokens - len(seq.prompt_token_ids)
        self.num_generation_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
        seq.last_token_time = now
        req.metrics.last_token_time = now
        # the grammar allows nothing more (complete) or rejected the token: the output ends with this token
        grammar_ended = seq.grammar is not None and (
            not seq.grammar.consume_token(self.structured.eos.for_grammar(token)) or seq.grammar.is_stopped()
        )
        stop = check_stop(seq, token, num_tokens, grammar_ended, self.eos_token_ids, self.max_model_len)
        if stop.reason is not None:
            self._end(seq, stop.reason)
        return TokenItem(seq, req.outputs[seq.index], token, logprobs, num_output_tokens, *stop)

    def _end(self, seq: Sequence, reason: str) -> None:
        """End seq (finished or aborted): the scheduler frees its blocks at once, the sampler its state."""
        self.scheduler.finish(seq, reason)
        self.sampler.forget(seq.seq_id)

    # ----- introspection ------------------------------------------------------------------
    def get_stats(self) -> EngineStats:
        return EngineStats.of(
            self.kv.stats(),
            self.scheduler,
            self.num_prompt_tokens,
            self.num_generation_tokens,
            self.bytes_per_block,
            self.runner.tier_copier.seconds(),
        )
