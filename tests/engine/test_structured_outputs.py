"""Structured outputs on the embedded model: every output parses and validates, whatever the seed.

The constrained rows share their steps with each other and with
unconstrained rows (one generate call), so this also checks that a mask
touches its own row only.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.structured.params import StructuredOutputsParams

SCHEMAS = {
    "nested-object": {
        "type": "object",
        "additionalProperties": False,
        "required": ["user", "active"],
        "properties": {
            "user": {
                "type": "object",
                "additionalProperties": False,
                "required": ["id", "name"],
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                    "name": {"type": "string", "maxLength": 10},
                },
            },
            "active": {"type": "boolean"},
        },
    },
    "enums": {
        "type": "object",
        "additionalProperties": False,
        "required": ["color", "size"],
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
    },
    "array": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    "required-and-optional": {
        "type": "object",
        "additionalProperties": False,
        "required": ["a"],
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 100},
            "b": {"type": "string", "maxLength": 5},
            "c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
    },
    "array-of-objects": {
        "type": "array",
        "maxItems": 3,
        "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["k"],
            "properties": {"k": {"enum": ["x", "y"]}, "v": {"type": ["integer", "null"], "minimum": 0, "maximum": 9}},
        },
    },
    "pattern": {"type": "string", "pattern": "^[a-z]{2,6}$"},
    "any-of": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"type": "null"}]},
}
SEEDS = range(8)


@pytest.fixture(scope="module")
def llm():
    return LLM(model=str(default_model_dir()), dtype="float32")


def test_every_output_validates_against_its_schema_for_every_seed(llm):
    cases = [(name, seed) for name in SCHEMAS for seed in SEEDS]
    params = [
        SamplingParams(
            temperature=1.0, seed=seed, max_tokens=160, structured_outputs=StructuredOutputsParams(json=SCHEMAS[name])
        )
        for name, seed in cases
    ]
    plain = SamplingParams(temperature=1.0, seed=0, max_tokens=24)  # unconstrained rows in the same steps
    outs = llm.generate(["Here is the JSON: "] * len(cases) + ["Hello"] * 4, params + [plain] * 4)
    for (name, seed), out in zip(cases, outs):
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", (name, seed, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    assert llm.get_stats().num_used_blocks == 0


def test_regex_choice_and_grammar_constrain_the_text(llm):
    regex = r"\d{3}-[A-Z]{2}"
    choices = ["alpha", "beta", "gamma delta"]
    lark = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,2}/'
    specs = [
        StructuredOutputsParams(regex=regex),
        StructuredOutputsParams(choice=choices),
        StructuredOutputsParams(grammar=lark),
        StructuredOutputsParams(json_object=True),
    ]
    prompts, params = [], []
    for spec in specs:
        for seed in SEEDS:
            prompts.append("Output: ")
            params.append(SamplingParams(temperature=1.0, seed=seed, max_tokens=60, structured_outputs=spec))
    outs = [o.outputs[0].text for o in llm.generate(prompts, params)]
    by_spec = [outs[i * len(SEEDS) : (i + 1) * len(SEEDS)] for i in range(len(specs))]
    assert all(re.fullmatch(regex, t) for t in by_spec[0]), by_spec[0]
    assert all(t in choices for t in by_spec[1]), by_spec[1]
    assert all(re.fullmatch(r"\(\d{1,2}(,\d{1,2})*\)", t) for t in by_spec[2]), by_spec[2]
    assert all(isinstance(json.loads(t), dict) for t in by_spec[3]), by_spec[3]


def test_n_completions_each_follow_the_grammar(llm):
    out = llm.generate(
        ["Pick: "],
        SamplingParams(
            n=4,
            temperature=1.0,
            seed=3,
            max_tokens=10,
            structured_outputs=StructuredOutputsParams(choice=["one", "two"]),
        ),
    )
    assert all(c.text in ("one", "two") for c in out[0].outputs)


@pytest.mark.parametrize(
    "spec, needle",
    [
        (dict(json={"type": "objekt"}), "objekt"),
        (dict(regex="(abc"), "unclosed group"),
        (dict(regex=r"a[^\s\S]"), "matches no output"),
        (dict(grammar="start: foo"), "foo"),
        (dict(json="{not json"), "not valid JSON"),
    ],
)
def test_a_spec_the_backend_cannot_serve_is_a_value_error_naming_it(llm, spec, needle):
    with pytest.raises(ValueError, match="structured_outputs") as info:
        llm.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(**spec)))
    assert needle in str(info.value)
    assert llm.get_stats().num_used_blocks == 0


def test_a_spec_is_compiled_once_and_each_sequence_gets_its_own_matcher(llm):
    structured = llm.llm_engine.structured
    spec = StructuredOutputsParams(json=SCHEMAS["enums"])
    same = StructuredOutputsParams(json=json.dumps(SCHEMAS["enums"]), field="guided_json")  # same schema as text
    assert structured.compile(spec) is structured.compile(same)
    first, second = structured.matcher_for(spec), structured.matcher_for(spec)
    assert first is not second
    brace = llm.get_tokenizer().encode("{", add_special_tokens=False)
    assert first.consume_tokens(brace)
    assert second.consume_tokens(brace)  # untouched by the first one's progress


def test_constrained_rows_leave_the_unconstrained_rows_of_their_steps_unchanged(llm):
    plain = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=12) for i in range(4)]
    alone = [o.outputs[0].token_ids for o in llm.generate(["Hello"] * 4, plain)]
    constrained = [
        SamplingParams(
            temperature=1.0, seed=i, max_tokens=40, structured_outputs=StructuredOutputsParams(json=SCHEMAS["enums"])
        )
        for i in range(4)
    ]
    shared = llm.generate(["Hello"] * 4 + ["JSON: "] * 4, plain + constrained)
    assert [o.outputs[0].token_ids for o in shared[:4]] == alone


def test_forking_n_completions_while_the_step_masks_are_still_filling_leaves_the_parent_matcher_alone(llm):
    # On a GPU the forward returns before it has run, so the engine forks a prompt's n > 1 children while the
    # grammar thread may still be filling this step's masks; llguidance holds each matcher it fills borrowed
    # ("Already mutably borrowed" for anything else touching it), so a fork must not read the parent's matcher.
    engine = llm.llm_engine
    spec = StructuredOutputsParams(json=SCHEMAS["nested-object"])
    engine.add_request("fork-during-fill", "Pick: ", SamplingParams(n=3, max_tokens=8, structured_outputs=spec))
    parent = engine.requests["fork-during-fill"].seqs[0]
    engine.scheduler.after_step(engine.scheduler.schedule())  # the prompt's blocks, as a step before the fork
    others = [engine.structured.matcher_for(spec) for _ in range(4000)]  # a fill long enough to fork during
    bitmask = engine.sampler.grammar_bitmask
    bitmask.prefetch([parent.grammar] + others, engine.runner.vocab_size, engine.runner.device)
    try:
        while True:  # until the grammar thread holds the parent's matcher
            try:
                parent.grammar.is_accepting()
            except RuntimeError:
                break
        children = [engine.fork(parent) for _ in range(parent.num_forks_pending)]
        assert len(children) == 2 and all(c.grammar is not None and c.grammar is not parent.grammar for c in children)
    finally:
        bitmask._pending[1].result()
        bitmask._pending = None
        engine.abort_request("fork-during-fill")
    assert llm.get_stats().num_used_blocks == 0
