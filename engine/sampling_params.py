"""Per-request sampling parameters, validated when built (vLLM-compatible names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from pagedinfer.engine.structured.params import StructuredOutputsParams

GREEDY_TEMPERATURE = 1e-5  # below this, sampling is greedy (vLLM's _SAMPLING_EPS)
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's: a bias is in [-100, 100]


def _check_int(name: str, value, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _check_float(name: str, value, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a finite number, got {value!r}")
    if (value < lo or (lo_open and value == lo)) or (value > hi or (hi_open and value == hi)):
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise ValueError(f"{name}: must be in {left}{lo}, {hi}{right}, got {value!r}")


def _check_logit_bias(bias) -> None:
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias: must be a dict of token id to bias, got {type(bias).__name__}")
    for token, value in bias.items():
        _check_int("logit_bias", token, 0)
        _check_float("logit_bias", value, -LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's completions.

    temperature below GREEDY_TEMPERATURE (1e-5, as vLLM), 0 included, is
    greedy: the sampler takes the argmax. Dividing float32 logits by a tinier
    temperature overflows to inf and the softmax to NaN, so such a temperature
    cannot be sampled from; in the limit it is the argmax anyway.
    top_k None means no top-k cut; -1 and 0, vLLM's spellings of it, are
    accepted and stored as None.
    logit_bias adds its value, in [-100, 100], to the token's logit before
    penalties, temperature and cuts, as OpenAI's; logprobs stay those of the
    model's own distribution (vLLM's raw logprobs).
    prompt_logprobs=k reports, per prompt token after the first, its logprob
    given the tokens before it and the top k (None for the first, as vLLM).
    Penalties follow vLLM/OpenAI: presence and frequency act on generated
    tokens, repetition on prompt and generated tokens.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | tuple[str, ...] | None = None
    stop_token_ids: list[int] | tuple[int, ...] | None = None
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before sampling (OpenAI's)
    prompt_logprobs: int | None = None  # each prompt token's logprob given its prefix, plus the top k
    structured_outputs: StructuredOutputsParams | None = None  # JSON schema, regex, choice or grammar
    stop_strings: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        if self.n > 128:
            raise ValueError(f"n: must be <= 128, got {self.n}")
        _check_float("temperature", self.temperature, 0.0, 100.0)
        _check_float("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        if self.top_k in (-1, 0) and not isinstance(self.top_k, bool):
            object.__setattr__(self, "top_k", None)
        _check_int("top_k", self.top_k, 1, allow_none=True)
        _check_float("min_p", self.min_p, 0.0, 1.0)
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, 100.0, lo_open=True)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens: must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        _check_int("logprobs", self.logprobs, 0, allow_none=True)
        if self.logprobs is not None and self.logprobs > 20:
            raise ValueError(f"logprobs: must be <= 20, got {self.logprobs}")
        _check_int("prompt_logprobs", self.prompt_logprobs, 0, allow_none=True)
        if self.prompt_logprobs is not None and self.prompt_logprobs > 20:
            raise ValueError(f"prompt_logprobs: must be <= 20, got {self.prompt_logprobs}")
        _check_logit_bias(self.logit_bias)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(
                f"structured_outputs: expected StructuredOutputsParams, got {type(self.structured_outputs).__name__}"
            )
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        for s in stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop: each stop must be a non-empty string, got {s!r}")
        object.__setattr__(self, "stop_strings", stops)
        for t in self.stop_token_ids or ():
            _check_int("stop_token_ids", t, 0)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be a boolean, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @cached_property  # read per row per step: computed once (a frozen dataclass's __dict__ still takes it)
    def no_row_work(self) -> bool:
        """Nothing the sampler applies to a row before its argmax or draw (logprobs, logit bias, min_tokens,
        penalties). The sampler's per-row work (`engine/sampler.py`) is what this names; a new option there
        must be named here."""
        return (
            self.logprobs is None
            and not self.logit_bias
            and self.min_tokens == 0
            and self.repetition_penalty == 1.0
            and not self.presence_penalty
            and not self.frequency_penalty
        )

    @cached_property
    def argmax_only(self) -> bool:
        """Greedy with no per-row work: such a row's token is the argmax of its logits as they are."""
        return self.greedy and self.no_row_work

    @cached_property
    def device_sampled(self) -> bool:
        """No per-row work and no seed: the sampler's batched device path (`Sampler.sample_device`) draws it."""
        return self.no_row_work and self.seed is None
