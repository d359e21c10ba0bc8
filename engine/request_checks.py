"""A request checked before it is queued: its id, its prompt, and its parameters against the engine's limits; a
ValueError naming what is wrong for a request that could never run."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from pagedinfer.engine.beam import group as beam_group
from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.sampling_params import SamplingParams


def check_request_id(request_id: object, running: Container[str]) -> None:
    """Raise ValueError unless request_id is a non-empty string no running request has."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id: must be a non-empty string, got {request_id!r}")
    if request_id in running:
        raise ValueError(f"request_id: {request_id!r} is already running")


def prompt_token_ids(prompt: str | list[int], tokenizer: Any, vocab_size: int) -> list[int]:
    """Token ids of a prompt (a string, tokenized, or token ids), validated: non-empty, ints within the vocabulary."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: must not be empty")
        ids = list(tokenizer(prompt).input_ids)
    elif isinstance(prompt, (list, tuple)):
        ids = list(prompt)
    else:
        raise ValueError(f"prompt: must be a string or a list of token ids, got {type(prompt).__name__}")
    if not ids:
        raise ValueError("prompt: must not be empty")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"prompt: token id {t!r} is not in the vocabulary [0, {vocab_size})")
    return ids


def check_request(
    prompt_token_ids: list[int],
    params: SamplingParams | BeamSearchParams,
    *,
    max_model_len: int,
    vocab_size: int,
    max_num_seqs: int,
    num_gpu_blocks: int,
    block_size: int,
) -> None:
    """Raise ValueError (naming the parameter) if the request can never run."""
    if not isinstance(params, (SamplingParams, BeamSearchParams)):
        raise ValueError(f"sampling_params: expected SamplingParams or BeamSearchParams, got {type(params).__name__}")
    n = len(prompt_token_ids)
    if n >= max_model_len:
        raise ValueError(f"prompt: {n} tokens; must be shorter than max_model_len={max_model_len}")
    if n + params.max_tokens > max_model_len:
        raise ValueError(
            f"max_tokens: prompt ({n} tokens) + max_tokens ({params.max_tokens}) = {n + params.max_tokens}"
            f" exceeds max_model_len={max_model_len}; lower max_tokens to at most"
            f" {max_model_len - n}"
        )
    if isinstance(params, BeamSearchParams):
        beam_group.check_beam_request(n, params, max_num_seqs, num_gpu_blocks, block_size)
        return
    if params.n > max_num_seqs:
        raise ValueError(f"n: {params.n} completions exceed max_num_seqs={max_num_seqs}")
    if params.logprobs is not None and params.logprobs > vocab_size:
        raise ValueError(f"logprobs: must be <= vocabulary size {vocab_size}")
    biased = sorted(t for t in params.logit_bias or {} if t >= vocab_size)
    if biased:
        raise ValueError(f"logit_bias: token ids {biased} are outside the vocabulary (ids < {vocab_size})")
    outside = [t for t in params.stop_token_ids or () if t >= vocab_size]
    if outside:
        raise ValueError(f"stop_token_ids: {outside} are outside the vocabulary (ids < {vocab_size})")
