"""The waiting-queue limit as a pure decision: a request costs prompts x n sequences."""

from __future__ import annotations

import pytest

from pagedinfer.engine.server.admission import check_waiting_limit


def test_a_request_that_fits_beside_the_queue_is_admitted():
    assert check_waiting_limit(num_waiting=0, num_prompts=1, n=1, limit=1) is None
    assert check_waiting_limit(num_waiting=6, num_prompts=2, n=2, limit=10) is None  # 6 + 4 == 10
    assert check_waiting_limit(num_waiting=10**6, num_prompts=256, n=16, limit=None) is None


def test_one_request_with_many_prompts_counts_each_of_them():
    refusal = check_waiting_limit(num_waiting=0, num_prompts=5000, n=1, limit=1024)
    assert refusal is not None and refusal.status_code == 400 and refusal.param == "prompt"
    assert "5000" in refusal.message and "1024" in refusal.message


def test_n_is_named_when_the_prompts_alone_would_fit():
    refusal = check_waiting_limit(num_waiting=0, num_prompts=100, n=16, limit=1024)
    assert refusal is not None and refusal.status_code == 400 and refusal.param == "n"
    assert "1600" in refusal.message


def test_a_request_pushing_the_queue_over_the_limit_is_told_to_retry():
    refusal = check_waiting_limit(num_waiting=1000, num_prompts=20, n=2, limit=1024)  # 1000 + 40 > 1024
    assert refusal is not None and refusal.status_code == 503 and refusal.param is None
    assert "1000" in refusal.message and "40" in refusal.message


def test_a_request_that_can_never_fit_is_a_400_even_with_a_full_queue():
    refusal = check_waiting_limit(num_waiting=1024, num_prompts=2, n=1, limit=1)
    assert refusal is not None and refusal.status_code == 400


@pytest.mark.parametrize("field", ["num_prompts", "n"])
def test_nonsense_counts_are_a_named_value_error(field):
    kwargs = dict(num_waiting=0, num_prompts=1, n=1, limit=4)
    kwargs[field] = 0
    with pytest.raises(ValueError, match=field):
        check_waiting_limit(**kwargs)
