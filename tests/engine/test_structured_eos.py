"""Several EOS ids under a grammar: the backend knows one, the engine maps the others onto it (engine/structured/eos.py)."""

from __future__ import annotations

import re

import pytest

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.structured.eos import GrammarEos
from pagedinfer.engine.structured.params import StructuredOutputsParams


@pytest.mark.parametrize(
    "ids, primary, others",
    [
        ([], None, ()),
        ([7], 7, ()),
        ({9, 2, 5}, 2, (5, 9)),
        ([5, 2, 5], 2, (5,)),
    ],
)
def test_the_smallest_eos_id_is_the_one_the_backend_is_told(ids, primary, others):
    eos = GrammarEos.of(ids)
    assert (eos.primary, eos.others) == (primary, others)


def test_every_eos_alias_is_consumed_as_the_primary_and_other_tokens_as_themselves():
    eos = GrammarEos.of([2, 5, 9])
    assert [eos.for_grammar(t) for t in (2, 5, 9, 3, 0)] == [2, 2, 2, 3, 0]
    assert GrammarEos.of([]).for_grammar(4) == 4


def test_aliases_past_the_mask_or_without_a_primary_inside_it_are_left_out():
    assert GrammarEos.of([2, 5, 900]).aliases_in(384) == (5,)
    assert GrammarEos.of([400, 401]).aliases_in(384) == ()
    assert GrammarEos.of([]).aliases_in(384) == ()


def test_an_inconsistent_eos_view_is_a_value_error():
    with pytest.raises(ValueError, match="others"):
        GrammarEos(None, (3,))
    with pytest.raises(ValueError, match="others"):
        GrammarEos(3, (3, 4))


@pytest.fixture(scope="module")
def two_eos_llm(make_model):
    """A tiny model whose generation config ends on </s> (2) or <|user|> (5), as Llama 3 ends on two ids."""
    llm = LLM(str(make_model("llama", eos_token_id=[2, 5])), dtype="float32", device="cpu")
    assert llm.llm_engine.eos_token_ids == {2, 5}
    yield llm
    llm.shutdown()


def test_a_second_eos_id_is_allowed_only_where_the_grammar_may_end_and_ends_the_output(two_eos_llm):
    # the bias makes <|user|> (5, not the id the backend was told) the model's first choice at every step: the
    # mask must refuse it before the first digit (an empty output does not match) and allow it after one
    spec = StructuredOutputsParams(regex=r"\d+")
    out = two_eos_llm.generate(
        ["Number: "], SamplingParams(temperature=0.0, max_tokens=8, logit_bias={5: 100.0}, structured_outputs=spec)
    )[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == 5 and len(out.token_ids) == 2
    assert re.fullmatch(r"\d+", out.text), out.text
    unconstrained = two_eos_llm.generate(
        ["Number: "], SamplingParams(temperature=0.0, max_tokens=8, logit_bias={5: 100.0})
    )[0].outputs[0]
    assert unconstrained.token_ids == [5] and unconstrained.finish_reason == "stop"


def test_the_grammar_backend_is_told_one_eos_id(two_eos_llm):
    tokenizer = two_eos_llm.llm_engine.structured._ll_tokenizer()
    assert tokenizer.eos_token == 2
