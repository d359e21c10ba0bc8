"""Beam search parameters and outputs (vLLM's `BeamSearchParams`/`BeamSearchOutput` names).

Where the semantics differ from vLLM's `LLM.beam_search` (docs/beam-search.md):
- the search follows transformers' `generate(num_beams=K, early_stopping=True)`:
  it stops once beam_width hypotheses have finished, and the length penalty
  divides by the number of generated tokens (EOS included), not by prompt +
  output length without the EOS;
- temperature must be 0: the search ranks by the model's log-probabilities,
  and a temperature that changes nothing is refused rather than ignored;
- no per-token logprobs in the output (`cum_logprob` and `score` only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pagedinfer.contracts import validators
from pagedinfer.engine.sampling_params import SamplingParams

MAX_BEAM_WIDTH = 128  # as SamplingParams' n


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        validators.positive_int("beam_width", self.beam_width)
        if self.beam_width > MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width: must be <= {MAX_BEAM_WIDTH}, got {self.beam_width}")
        validators.positive_int("max_tokens", self.max_tokens)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be a boolean, got {getattr(self, name)!r}")
        if self.temperature != 0:
            raise ValueError(
                f"temperature: beam search ranks by the model's log-probabilities and takes no"
                f" temperature; use 0, got {self.temperature!r}"
            )
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
            raise ValueError(f"length_penalty: must be a finite number, got {lp!r}")

    @property
    def n(self) -> int:
        """Sequences the request returns (its beam width), as SamplingParams.n counts seats and choices."""
        return self.beam_width

    def beam_sampling_params(self) -> SamplingParams:
        """The parameters each beam's sequence carries through the scheduler (greedy, one completion)."""
        return SamplingParams(
            n=1,
            temperature=0.0,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )


@dataclass
class BeamSearchSequence:
    """One returned beam. As vLLM: `tokens` holds the prompt and the generated tokens, `text` the
    generated text only (a final EOS's text only with include_stop_str_in_output)."""

    tokens: list[int]
    text: str
    cum_logprob: float
    score: float  # cum_logprob / len(generated tokens) ** length_penalty (not in vLLM)
    finish_reason: str  # "stop" (EOS) or "length"
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The beam_width best sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence] = field(default_factory=list)
