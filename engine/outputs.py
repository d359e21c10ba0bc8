"""What the engine returns (vLLM-compatible names)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
