"""What the scheduler reads of the engine's configuration, built from `EngineConfig` in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pagedinfer.contracts.config.engine_config import EngineConfig


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's limits and policies (the KV cache manager holds the pool and its block size).

    Invariants (`EngineConfig` validates them; `of` is the one builder in the engine): both limits are
    positive; without chunked prefill, max_num_batched_tokens is at least max_model_len, so every prompt
    fits one step's budget.
    """

    max_num_batched_tokens: int  # tokens one step computes at most, over all its sequences
    max_num_seqs: int  # seats: sequences running at once (a request holds n, a beam group beam_width)
    enable_chunked_prefill: bool  # a prompt may take several steps; off: a prompt waits for a budget that holds it
    preemption_mode: Literal["recompute", "swap"]  # recompute: free and redo; swap: to the host pool

    @classmethod
    def of(cls, config: EngineConfig) -> SchedulerConfig:
        return cls(
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            enable_chunked_prefill=config.enable_chunked_prefill,
            preemption_mode=config.preemption_mode,
        )
