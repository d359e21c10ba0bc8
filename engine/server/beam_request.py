"""`use_beam_search` on /v1/completions and /v1/chat/completions (vLLM's request fields).

`n` is the beam width and the response's `n` choices are the best beams,
best first; `length_penalty` divides a finished beam's cumulative logprob by
its generated length to that power (docs/beam-search.md). A beam search
returns nothing until it ends (beams reorder until then), so `stream` is a
400, and so is every sampling field that beam search does not use, rather
than ignoring it; `length_penalty` without `use_beam_search` is a 400 too.
"""

from __future__ import annotations

from typing import Any

from pagedinfer.contracts.http.errors import ApiError, from_value_error

# request fields beam search ignores, and the value each may keep (its "not set")
# (compared with their type: a completions `logprobs: 0` asks for logprobs, a chat `logprobs: false` does not)
_NOT_APPLICABLE = (
    ("temperature", (0.0,)),
    ("top_p", (1.0,)),
    ("top_k", (-1, 0)),
    ("min_p", (0.0,)),
    ("presence_penalty", (0.0,)),
    ("frequency_penalty", (0.0,)),
    ("repetition_penalty", (1.0,)),
    ("seed", ()),
    ("stop", ([],)),
    ("min_tokens", (0,)),
    ("logprobs", (False,)),
    ("top_logprobs", ()),
)


def check_not_beam_fields(req: Any) -> None:
    """400 when a request without use_beam_search sets a beam-search-only field."""
    if getattr(req, "length_penalty", None) is not None:
        raise ApiError(
            400,
            "length_penalty: applies only with use_beam_search: true",
            param="length_penalty",
            code="invalid_parameter",
        )


def check_beam_options(req: Any, options: dict[str, Any]) -> None:
    """400 naming the field when a use_beam_search request also asks for a feature beam search does not
    apply (echo, prompt logprobs, best_of, logit_bias, structured outputs, tools), rather than ignoring it."""
    if getattr(req, "echo", False):
        raise ApiError(
            400,
            "echo: does not apply to beam search (use_beam_search: true); leave it unset",
            param="echo",
            code="invalid_parameter",
        )
    for key, value in options.items():
        if value is None or (key == "n" and value == req.n):
            continue
        param = getattr(value, "field", None) or {"n": "best_of"}.get(key, key)
        raise ApiError(
            400,
            f"{param}: does not apply to beam search (use_beam_search: true); leave it unset",
            param=param,
            code="invalid_parameter",
        )


def beam_search_params(req: Any, max_tokens: int) -> Any:
    """The BeamSearchParams of a use_beam_search request; 400 naming the field that does not apply."""
    from pagedinfer.engine.beam.params import BeamSearchParams

    if req.stream:
        raise ApiError(
            400,
            "stream: not supported with use_beam_search (the beams reorder until the search"
            " ends, so there is nothing to stream before it)",
            param="stream",
            code="invalid_parameter",
        )
    for name, unset in _NOT_APPLICABLE:
        value = getattr(req, name, None)
        if value is not None and not any(value == u and type(value) is type(u) for u in unset):
            raise ApiError(
                400,
                f"{name}: does not apply to beam search (use_beam_search: true); leave it unset",
                param=name,
                code="invalid_parameter",
            )
    try:
        return BeamSearchParams(
            beam_width=req.n,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            length_penalty=1.0 if req.length_penalty is None else req.length_penalty,
        )
    except ValueError as exc:
        raise from_value_error(exc) from None


def check_beam_fits(info: Any, prompts: list[list[int]], params: Any) -> None:
    """400 naming `n` when the beams of any prompt could not fit the server's KV pool (or its
    max_num_seqs), before anything is queued.

    Every prompt length is checked: the blocks a group may need are not monotonic in it (a prompt
    ending just past a block boundary leaves every beam its own partial block), so the longest
    prompt can fit where a shorter one does not."""
    from pagedinfer.engine.beam.group import check_beam_request

    try:
        for num_prompt_tokens in sorted({len(p) for p in prompts}):
            check_beam_request(
                num_prompt_tokens, params, info.max_num_seqs, info.num_gpu_blocks, info.block_size, width_name="n"
            )
    except ValueError as exc:
        raise from_value_error(exc) from None
