"""One sequence: the tokens of a prompt plus one completion, and its progress.

A request with n > 1 becomes n sequences: the first prefills the prompt and
the others are forked from it (sharing its blocks) when it is sampled first.

The scheduling idea (from vLLM v1): there is no prefill phase and decode
phase. Every sequence has num_tokens and num_computed_tokens; a step computes
some of the missing ones. A prompt may take several steps (chunked prefill);
a decode is the case num_tokens - num_computed_tokens == 1.

A beam-search request is a `SequenceGroup`: its live beams are sequences
that the scheduler advances, preempts and resumes as a whole (see
`engine/beam/`).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from pagedinfer.engine.sampling_params import SamplingParams

_seq_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    index: int = 0  # which of the request's n completions
    prompt: str | None = None
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first admission
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of full blocks
    logprobs: list[dict] | None = None
    num_forks_pending: int = 0  # children still to fork after the prompt's first sample
    # async scheduling (engine/async_step/): token_ids ends with this many placeholders, tokens scheduled before
    # their ids are sampled; none of them counts as an output token until its id replaces it
    num_placeholders: int = 0
    was_admitted: bool = False
    output_text: str = ""
    detok: Any = None  # incremental detokenizer state, owned by the engine
    grammar: Any = None  # structured outputs: this sequence's llguidance matcher, advanced by each token
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    group: SequenceGroup | None = None  # the beam group this sequence is a live beam of
    # derived from params (frozen) at construction, read per token on the hot path:
    # len(token_ids) at which max_tokens ends the sequence: prompt + max_tokens (the engine also stops it
    # at max_model_len when that comes first)
    max_num_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        p = self.params
        self.max_num_tokens = len(self.prompt_token_ids) + p.max_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) : len(self.token_ids) - self.num_placeholders]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_placeholders - len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass(eq=False)
class SequenceGroup:
    """The live beams of one beam-search request.

    The scheduler treats the group's running beams as one unit: they are
    contiguous in its running list, scheduled in the same step, and preempted
    and resumed together. While the group waits or is swapped, only its
    leader `seqs[0]` is queued; the other beams follow it:
    - swap: every beam is swapped out and in with the leader, blocks shared
      between beams stay shared (one host block each);
    - recompute: the others are parked (WAITING, no blocks, in no queue);
      once the leader has recomputed its tokens, each is forked again from
      the leader at their common prefix, so that prefix is shared again.

    Invariant: `seqs` holds the live beams in the order the beam search
    (`engine/beam/search.py`) indexes them; the engine replaces it after each
    beam step.
    """

    request_id: str
    beam_width: int  # seats of max_num_seqs the group holds from its admission on
    seqs: list[Sequence]

    @property
    def leader(self) -> Sequence:
        return self.seqs[0]
