"""The checks a request passes before it is queued, called directly (no model: a prompt of token ids needs no
tokenizer, and an empty string is refused before one is asked)."""

from __future__ import annotations

import pytest

from pagedinfer.engine.request_checks import check_request_id, prompt_token_ids

VOCAB = 10


@pytest.mark.parametrize("request_id", ["", None, 7])
def test_a_request_id_must_be_a_non_empty_string(request_id):
    with pytest.raises(ValueError, match="request_id: must be a non-empty string"):
        check_request_id(request_id, {})


def test_a_running_request_id_is_refused():
    check_request_id("b", {"a": object()})
    with pytest.raises(ValueError, match="request_id: 'a' is already running"):
        check_request_id("a", {"a": object()})


def test_token_ids_within_the_vocabulary_pass_as_a_list():
    assert prompt_token_ids((0, 9), None, VOCAB) == [0, 9]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "prompt: must not be empty"),
        ([], "prompt: must not be empty"),
        ([3, VOCAB], r"prompt: token id 10 is not in the vocabulary \[0, 10\)"),
        ([-1], "prompt: token id -1"),
        ([True], "prompt: token id True"),
        ([1.0], "prompt: token id 1.0"),
        (b"ab", "prompt: must be a string or a list of token ids, got bytes"),
    ],
)
def test_a_bad_prompt_is_named(prompt, message):
    with pytest.raises(ValueError, match=message):
        prompt_token_ids(prompt, None, VOCAB)
