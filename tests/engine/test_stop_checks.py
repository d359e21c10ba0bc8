"""`check_stop`, the finishes a sampled token decides without its text, on plain sequences (no model)."""

from __future__ import annotations

import pytest

from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sequence import Sequence
from pagedinfer.engine.stop_checks import Stop, check_stop

EOS = 2
PROMPT = [5, 6, 7]


def _after(params: SamplingParams, *outputs: int) -> tuple[Sequence, int]:
    """A sequence with `outputs` appended after the prompt, and its length."""
    seq = Sequence(request_id="r", prompt_token_ids=list(PROMPT), params=params, arrival_time=0.0)
    seq.token_ids.extend(outputs)
    return seq, len(seq.token_ids)


def _check(params: SamplingParams, *outputs: int, grammar_ended=False, max_model_len=100) -> Stop:
    seq, num_tokens = _after(params, *outputs)
    return check_stop(seq, outputs[-1], num_tokens, grammar_ended, {EOS}, max_model_len)


def test_an_ordinary_token_goes_on():
    assert _check(SamplingParams(max_tokens=5), 9) == Stop(None, None, None)
    assert _check(SamplingParams(max_tokens=5), 9).reason is None


@pytest.mark.parametrize(("min_tokens", "expected"), [(0, "stop"), (2, "stop"), (3, None)])
def test_eos_ends_once_min_tokens_are_out(min_tokens, expected):
    assert _check(SamplingParams(max_tokens=5, min_tokens=min_tokens), 9, EOS).early == expected


def test_ignore_eos_keeps_going():
    assert _check(SamplingParams(max_tokens=5, ignore_eos=True), EOS).reason is None


def test_a_stop_token_is_its_reason_and_respects_min_tokens():
    assert _check(SamplingParams(max_tokens=5, stop_token_ids=[11]), 11) == Stop("stop", 11, None)
    assert _check(SamplingParams(max_tokens=5, stop_token_ids=[11], min_tokens=2), 11).reason is None


def test_the_length_limit_is_max_tokens_or_max_model_len_whichever_comes_first():
    assert _check(SamplingParams(max_tokens=2), 9, 9) == Stop(None, None, "length")
    assert _check(SamplingParams(max_tokens=3), 9, 9).reason is None
    assert _check(SamplingParams(max_tokens=3), 9, 9, max_model_len=len(PROMPT) + 2).late == "length"


def test_the_grammar_end_is_late_and_wins_over_the_length_limit():
    assert _check(SamplingParams(max_tokens=1), 9, grammar_ended=True) == Stop(None, None, "stop")
    # EOS at the grammar's end: early (its text dropped), the late reason kept for the output side
    assert _check(SamplingParams(max_tokens=5), EOS, grammar_ended=True) == Stop("stop", None, "stop")
