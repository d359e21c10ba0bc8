"""What the engine returns (vLLM-compatible names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedinfer.engine.kv_offload.tier import LOAD, STORE

if TYPE_CHECKING:
    from pagedinfer.engine.kv_cache_manager import KVCacheStats
    from pagedinfer.engine.scheduler import Scheduler


@dataclass(frozen=True)
class Logprob:
    logprob: float
    rank: int  # 1 = the most likely token
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""  # cumulative
    token_ids: list[int] = field(default_factory=list)  # cumulative
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or token id that matched
    logprobs: list[dict[int, Logprob]] | None = None  # per generated token: sampled + top-k
    cumulative_logprob: float | None = None  # sum of the tokens' logprobs (set by beam search)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """time.monotonic() seconds; None until it happens."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    num_cached_tokens: int  # prompt tokens served by the prefix cache
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    # with SamplingParams.prompt_logprobs: per prompt token, None for the first
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine. Counters are cumulative since start."""

    num_total_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_free_blocks: int  # free, but still holding a reusable prefix
    kv_usage: float  # used / total
    prefix_cache_query_tokens: int  # prompt tokens of requests at their first admission
    prefix_cache_hit_tokens: int  # of those, tokens served by the prefix cache
    prefix_cache_preempted_query_tokens: int  # tokens of recompute-preempted sequences looked up again
    prefix_cache_preempted_hit_tokens: int  # of those, tokens found in the cache (not prompt-cache hits)
    num_allocation_failures: int
    num_preemptions: dict[str, int]
    # Unfinished requests (one per prompt; its n completions are one request), each in one state:
    # running if any of its sequences runs, else swapped if any is swapped out, else waiting.
    num_running_reqs: int
    num_waiting_reqs: int
    num_swapped_reqs: int
    num_waiting_seqs: int  # sequences to admit: a waiting request with n > 1 not yet forked counts n
    num_prompt_tokens: int
    num_generation_tokens: int
    # the prefix cache's host tier (engine/kv_offload/); zero when it is off
    kv_offload_num_blocks: int = 0  # host pool blocks the tier may fill (shared with the swap space)
    kv_offload_cached_blocks: int = 0  # tier entries now
    prefix_cache_offload_hit_tokens: int = 0  # of prefix_cache_hit_tokens, those loaded back from the tier
    kv_offload_bytes: dict[str, int] = field(default_factory=dict)  # by direction: device_to_host, host_to_device
    kv_offload_copy_seconds: dict[str, float] = field(default_factory=dict)  # by direction

    @property
    def kv_offload_usage(self) -> float:
        """Tier entries / the blocks it may fill (0 when off)."""
        return self.kv_offload_cached_blocks / self.kv_offload_num_blocks if self.kv_offload_num_blocks else 0.0

    @classmethod
    def of(
        cls,
        kv: KVCacheStats,
        scheduler: Scheduler,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        bytes_per_block: int,
        copy_seconds: dict[str, float],
    ) -> EngineStats:
        """The snapshot from the KV cache manager's and the scheduler's state, the engine's token counters, and the
        host tier's copy times by direction."""
        requests = scheduler.num_requests()
        return cls(
            num_total_blocks=kv.num_total_blocks,
            num_used_blocks=kv.num_used_blocks,
            num_free_blocks=kv.num_free_blocks,
            num_cached_free_blocks=kv.num_cached_free_blocks,
            kv_usage=kv.num_used_blocks / kv.num_total_blocks,
            prefix_cache_query_tokens=kv.prefix_cache_query_tokens,
            prefix_cache_hit_tokens=kv.prefix_cache_hit_tokens,
            prefix_cache_preempted_query_tokens=kv.prefix_cache_preempted_query_tokens,
            prefix_cache_preempted_hit_tokens=kv.prefix_cache_preempted_hit_tokens,
            num_allocation_failures=scheduler.counters.num_allocation_failures,
            num_preemptions=dict(scheduler.counters.num_preemptions),
            num_running_reqs=requests.running,
            num_waiting_reqs=requests.waiting,
            num_swapped_reqs=requests.swapped,
            num_waiting_seqs=sum(scheduler.seats(s) for s in scheduler.waiting),  # n, beam_width
            num_prompt_tokens=num_prompt_tokens,
            num_generation_tokens=num_generation_tokens,
            kv_offload_num_blocks=kv.tier.num_blocks,
            kv_offload_cached_blocks=kv.tier.num_cached_blocks,
            prefix_cache_offload_hit_tokens=kv.tier.hit_tokens,
            kv_offload_bytes={
                STORE: kv.tier.num_stored_blocks * bytes_per_block,
                LOAD: kv.tier.num_loaded_blocks * bytes_per_block,
            },
            kv_offload_copy_seconds=copy_seconds,
        )


@dataclass(frozen=True)
class CompletionDelta:
    """What one completion gained in one step (everything since the request's previous delta)."""

    index: int
    new_text: str  # appended to the completion's text
    new_token_ids: list[int]
    new_logprobs: list[dict[int, Logprob]] | None  # one entry per new token, when logprobs were asked
    finish_reason: str | None
    stop_reason: int | str | None
    cumulative_logprob: float | None


@dataclass(frozen=True)
class RequestOutputDelta:
    """What a request gained in one step; `OutputAccumulator` turns the deltas back into a RequestOutput.

    Each token, logprob and character crosses once, so a consumer's cost is
    linear in the output (a cumulative RequestOutput per step is quadratic).
    Every completion of the request is listed, in index order, new tokens or not.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    num_cached_tokens: int
    outputs: list[CompletionDelta]
    finished: bool
    metrics: RequestMetrics
    # the request's prompt logprobs, complete (set on its first delta and on its finished one, else None)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


class OutputAccumulator:
    """Owns one RequestOutput per request and extends it in place with each delta (the consumer's side).

    Invariant: after the deltas of steps 1..t, the output equals what
    `LLMEngine.step()` returned for the request at step t (tests/engine/test_output_deltas.py).
    """

    def __init__(self) -> None:
        self.outputs: dict[str, RequestOutput] = {}

    def add(self, delta: RequestOutputDelta) -> RequestOutput:
        """The request's output with delta applied; forgotten here once finished (the caller keeps it)."""
        out = self.outputs.get(delta.request_id)
        if out is None:
            out = RequestOutput(
                delta.request_id,
                delta.prompt,
                delta.prompt_token_ids,
                delta.num_cached_tokens,
                outputs=[],
                finished=False,
                metrics=delta.metrics,
            )
            self.outputs[delta.request_id] = out
        while len(out.outputs) < len(delta.outputs):
            i = len(out.outputs)
            out.outputs.append(
                CompletionOutput(
                    index=delta.outputs[i].index, logprobs=[] if delta.outputs[i].new_logprobs is not None else None
                )
            )
        for c, d in zip(out.outputs, delta.outputs):
            c.index = d.index
            c.text += d.new_text
            c.token_ids.extend(d.new_token_ids)
            if d.new_logprobs is not None:
                if c.logprobs is None:
                    c.logprobs = []
                c.logprobs.extend(d.new_logprobs)
            c.finish_reason, c.stop_reason, c.cumulative_logprob = d.finish_reason, d.stop_reason, d.cumulative_logprob
        out.num_cached_tokens = delta.num_cached_tokens
        out.metrics = delta.metrics
        if delta.prompt_logprobs is not None:
            out.prompt_logprobs = delta.prompt_logprobs
        out.finished = delta.finished
        if delta.finished:
            del self.outputs[delta.request_id]
        return out
