"""Beam search bookkeeping (engine/beam/search.py), pure: candidates, hypotheses, termination."""

from __future__ import annotations

import math

import pytest

from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.beam.search import BeamSearch

EOS = 2


def lp(p: float) -> float:
    return math.log(p)


def test_first_step_keeps_the_best_beam_width_tokens_of_the_prompt():
    search = BeamSearch(beam_width=2, max_tokens=5, eos_token_ids=frozenset({EOS}))
    assert search.num_candidates == 4
    search.report(0, [(10, lp(0.5)), (11, lp(0.3)), (12, lp(0.1)), (13, lp(0.05))])
    step = search.step()
    assert step.parents == (0, 0) and step.tokens == (10, 11) and not step.done
    assert [b.token_ids for b in search.live] == [(10,), (11,)]


def test_candidates_are_ranked_over_all_beams_by_accumulated_logprob():
    search = BeamSearch(beam_width=2, max_tokens=5)
    search.report(0, [(10, lp(0.6)), (11, lp(0.4))])
    search.step()  # live: (10,) at log .6, (11,) at log .4
    search.report(0, [(20, lp(0.5)), (21, lp(0.5))])  # .30, .30
    search.report(1, [(30, lp(0.9)), (31, lp(0.1))])  # .36, .04
    step = search.step()
    assert step.parents == (1, 0) and step.tokens == (30, 20)  # beam 0's second child and beam 1's first
    assert search.live[0].cum_logprob == pytest.approx(lp(0.4) + lp(0.9))


def test_an_eos_within_the_top_beam_width_finishes_a_hypothesis_with_the_length_penalty():
    search = BeamSearch(beam_width=2, max_tokens=10, length_penalty=2.0, eos_token_ids=frozenset({EOS}))
    search.report(0, [(10, lp(0.5)), (11, lp(0.4)), (12, lp(0.05)), (13, lp(0.05))])
    search.step()
    search.report(0, [(EOS, lp(0.7)), (20, lp(0.3))])
    search.report(1, [(21, lp(0.9)), (EOS, lp(0.1))])
    step = search.step()
    (hyp,) = search.hypotheses
    assert hyp.token_ids == (10, EOS) and hyp.finish_reason == "stop"
    cum = lp(0.5) + lp(0.7)
    assert hyp.score == pytest.approx(cum / 2**2.0)  # generated length (EOS included), not the prompt's
    assert step.tokens == (21, 20) and not step.done  # the EOS continuation never runs on


def test_an_eos_ranked_below_beam_width_is_dropped():
    search = BeamSearch(beam_width=1, max_tokens=10, eos_token_ids=frozenset({EOS}))
    search.report(0, [(10, lp(0.6)), (EOS, lp(0.4))])
    step = search.step()
    assert search.hypotheses == [] and step.tokens == (10,)


def test_early_stopping_ends_the_search_once_beam_width_hypotheses_finished():
    search = BeamSearch(beam_width=2, max_tokens=10, eos_token_ids=frozenset({EOS}))
    search.report(0, [(EOS, lp(0.5)), (10, lp(0.3)), (11, lp(0.1)), (12, lp(0.1))])
    assert not search.step().done
    search.report(0, [(EOS, lp(0.9)), (20, lp(0.1))])
    search.report(1, [(21, lp(0.9)), (22, lp(0.1))])
    step = search.step()
    assert step.done and search.live == []
    assert [h.token_ids for h in search.hypotheses] == [(10, EOS), (EOS,)]  # best score first


def test_max_tokens_finishes_the_top_beam_width_candidates_as_length():
    search = BeamSearch(beam_width=2, max_tokens=1)
    search.report(0, [(10, lp(0.5)), (11, lp(0.3)), (12, lp(0.2))])
    step = search.step()
    assert step.done
    assert [(h.token_ids, h.finish_reason) for h in search.hypotheses] == [((10,), "length"), ((11,), "length")]


def test_a_step_needs_every_live_beam_and_reports_name_live_beams():
    search = BeamSearch(beam_width=2, max_tokens=5)
    search.report(0, [(10, lp(0.5)), (11, lp(0.5))])
    search.step()
    search.report(1, [(20, lp(1.0))])
    assert not search.ready
    with pytest.raises(RuntimeError):
        search.step()
    with pytest.raises(ValueError, match="beam_index"):
        search.report(2, [])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(beam_width=0, max_tokens=4), "beam_width"),
        (dict(beam_width=True, max_tokens=4), "beam_width"),
        (dict(beam_width=2, max_tokens=0), "max_tokens"),
        (dict(beam_width=2, max_tokens=4, temperature=0.7), "temperature"),
        (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty"),
        (dict(beam_width=2, max_tokens=4, ignore_eos="yes"), "ignore_eos"),
    ],
)
def test_bad_beam_search_params_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BeamSearchParams(**kwargs)
