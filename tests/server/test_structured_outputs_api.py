"""response_format and vLLM's guided_* fields through the openai client; bad constraints are 400s naming the field."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "days", "tags"],
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
        "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["sun", "rain", "snow"]}},
    },
}


@pytest.mark.parametrize("seed", range(4))
def test_chat_response_format_json_schema_validates(openai_client, server, seed):
    out = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Plan a trip"}],
        max_tokens=120,
        temperature=1.0,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    assert out.choices[0].finish_reason == "stop"


def test_completions_json_object_and_streamed_json_schema(openai_client, server):
    # any object: this random-weight model's keys are unbounded strings, which may run to max_tokens
    # (finish_reason "length", as any server truncates); a finished one parses (the embedded model's
    # always finish: tests/engine/test_structured_outputs.py)
    for seed in range(4):
        out = openai_client.completions.create(
            model=server.model,
            prompt="JSON:",
            max_tokens=40,
            temperature=1.0,
            seed=seed,
            extra_body={"response_format": {"type": "json_object"}},
        )
        text = out.choices[0].text
        assert text.startswith("{")
        if out.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
    stream = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Plan"}],
        max_tokens=120,
        temperature=1.0,
        seed=1,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_vllm_guided_fields(openai_client, server):
    choice = openai_client.completions.create(
        model=server.model,
        prompt="Pick:",
        max_tokens=10,
        temperature=1.0,
        extra_body={"guided_choice": ["left", "right"]},
    )
    assert choice.choices[0].text in ("left", "right")
    regex = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Code?"}],
        max_tokens=20,
        temperature=1.0,
        extra_body={"guided_regex": r"[A-Z]{3}-\d{2}"},
    )
    assert re.fullmatch(r"[A-Z]{3}-\d{2}", regex.choices[0].message.content)
    grammar = openai_client.completions.create(
        model=server.model,
        prompt="Bits:",
        max_tokens=20,
        temperature=1.0,
        extra_body={"guided_grammar": 'start: ("0" | "1")~3'},
    )
    assert re.fullmatch(r"[01]{3}", grammar.choices[0].text)
    as_json = openai_client.completions.create(
        model=server.model, prompt="x", max_tokens=120, temperature=1.0, extra_body={"guided_json": json.dumps(SCHEMA)}
    )
    jsonschema.validate(json.loads(as_json.choices[0].text), SCHEMA)


BAD = [
    (
        "malformed-schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
        "response_format",
        "objekt",
    ),
    (
        "unsatisfiable-schema",
        {"guided_json": {"type": "string", "minLength": 5, "maxLength": 2}},
        "guided_json",
        "minLength",
    ),
    ("guided-json-not-json", {"guided_json": "{nope"}, "guided_json", "not valid JSON"),
    ("regex-matching-nothing", {"guided_regex": r"a[^\s\S]"}, "guided_regex", "matches no output"),
    ("regex-malformed", {"guided_regex": "(abc"}, "guided_regex", "regex"),
    # llguidance's regex-to-grammar drops a final lone backslash: "ab\\" was served as "ab"
    ("regex-trailing-backslash", {"guided_regex": "ab\\"}, "guided_regex", "backslash"),
    ("grammar-unknown-rule", {"guided_grammar": "start: foo"}, "guided_grammar", "foo"),
    ("choice-empty-string", {"guided_choice": [""]}, "guided_choice", "non-empty"),
    ("two-constraints", {"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
]


@pytest.mark.parametrize("fields, param, needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_constraints_are_400s_naming_the_field(server, fields, param, needle):
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and needle in error["message"], error


def test_no_block_leaks_after_bad_constraints(server):
    for _, fields, *_ in BAD:
        httpx.post(
            server.url + "/v1/completions",
            json={"model": server.model, "prompt": "x", "max_tokens": 4, **fields},
            timeout=30,
        )
    metrics = server.wait_idle()
    assert metrics["pagedinfer_kv_cache_free_blocks"] == metrics["pagedinfer_kv_cache_num_blocks"]


def test_vllm_structured_outputs_field(openai_client, server):
    out = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Pick"}],
        max_tokens=10,
        temperature=1.0,
        extra_body={"structured_outputs": {"choice": ["up", "down"], "disable_any_whitespace": True}},
    )
    assert out.choices[0].message.content in ("up", "down")
    schema = openai_client.completions.create(
        model=server.model,
        prompt="x",
        max_tokens=120,
        temperature=1.0,
        extra_body={"structured_outputs": {"json": SCHEMA}},
    )
    jsonschema.validate(json.loads(schema.choices[0].text), SCHEMA)
    r = httpx.post(
        server.url + "/v1/completions",
        json={
            "model": server.model,
            "prompt": "x",
            "max_tokens": 2,
            "structured_outputs": {"regex": "a", "choice": ["a"]},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.text
