"""Every field the openai client and vLLM's clients send is accepted, and each does what it says."""

from __future__ import annotations

import httpx
import pytest

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_the_openai_client_sends_every_default_field_without_a_400(openai_client, server):
    out = openai_client.completions.create(
        model=server.model,
        prompt="Hello",
        max_tokens=3,
        temperature=0,
        echo=False,
        logit_bias={},
        best_of=1,
        user="someone",
        seed=3,
        suffix=None,
    )
    assert out.choices[0].finish_reason in ("length", "stop")
    chat = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logit_bias={},
        response_format={"type": "text"},
        tools=[WEATHER_TOOL],
        tool_choice="none",
        parallel_tool_calls=True,
        store=False,
        metadata={"team": "a"},
        service_tier="auto",
        user="someone",
        seed=3,
    )
    assert chat.choices[0].message.content is not None


def test_the_openai_clients_newer_chat_options_are_accepted_and_change_nothing(openai_client, server):
    # arguments of the client's chat.completions.create that describe the caller, OpenAI's prompt cache or
    # reasoning models: none changes what this engine does (they were 400s "unknown field")
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "Tell me"}], max_tokens=6, temperature=0)
    plain = openai_client.chat.completions.create(**kwargs)
    decorated = openai_client.chat.completions.create(
        **kwargs,
        safety_identifier="user-hash",
        prompt_cache_key="tenant-a",
        reasoning_effort="low",
        verbosity="low",
        modalities=["text"],
    )
    assert decorated.choices[0].message.content == plain.choices[0].message.content


def test_ignored_fields_change_nothing(openai_client, server):
    plain = openai_client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Tell me"}], max_tokens=6, temperature=0
    )
    decorated = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Tell me"}],
        max_tokens=6,
        temperature=0,
        store=True,
        metadata={"k": "v"},
        service_tier="default",
        user="u-1",
        response_format={"type": "text"},
    )
    assert decorated.choices[0].message.content == plain.choices[0].message.content
    assert decorated.usage.prompt_tokens == plain.usage.prompt_tokens


def test_logit_bias_of_100_forces_a_token_and_of_minus_100_bans_it(openai_client, server):
    forced = 42
    out = httpx.post(
        server.url + COMPLETIONS,
        json={
            "model": server.model,
            "prompt": [5, 6, 7],
            "max_tokens": 6,
            "temperature": 1.0,
            "seed": 0,
            "logit_bias": {str(forced): 100},
            "ignore_eos": True,
            "logprobs": 0,
        },
        timeout=60,
    ).json()
    tokens = out["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == 6
    forced_text = httpx.post(server.url + "/detokenize", json={"tokens": [forced]}, timeout=30).json()["prompt"]
    assert tokens == [forced_text] * 6
    greedy = openai_client.completions.create(
        model=server.model, prompt=[5, 6, 7], max_tokens=1, temperature=0, logprobs=0
    )
    first = greedy.choices[0].logprobs.tokens[0]
    first_id = httpx.post(
        server.url + "/tokenize", json={"prompt": first, "add_special_tokens": False}, timeout=30
    ).json()["tokens"]
    banned = openai_client.completions.create(
        model=server.model,
        prompt=[5, 6, 7],
        max_tokens=1,
        temperature=0,
        logprobs=0,
        logit_bias={str(first_id[0]): -100},
    )
    assert banned.choices[0].logprobs.tokens[0] != first


def test_tokenize_and_detokenize_round_trip_as_vllm_serves_them(server):
    r = httpx.post(
        server.url + "/tokenize",
        json={"model": server.model, "prompt": "The quick brown fox", "return_token_strs": True},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert len(body["token_strs"]) == body["count"]
    assert body["max_model_len"] > 0
    plain = httpx.post(
        server.url + "/tokenize", json={"prompt": "The quick brown fox", "add_special_tokens": False}, timeout=30
    ).json()
    back = httpx.post(
        server.url + "/detokenize", json={"model": server.model, "tokens": plain["tokens"]}, timeout=30
    ).json()
    assert back == {"prompt": "The quick brown fox"}
    usage = httpx.post(
        server.url + COMPLETIONS,
        json={"model": server.model, "prompt": "The quick brown fox", "max_tokens": 1},
        timeout=30,
    ).json()["usage"]
    assert usage["prompt_tokens"] == body["count"]  # the same tokens the completions endpoint feeds the engine


def test_tokenize_messages_counts_the_rendered_chat_prompt(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    body = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=30).json()
    usage = httpx.post(
        server.url + CHAT, json={"model": server.model, "messages": messages, "max_tokens": 1}, timeout=30
    ).json()["usage"]
    assert body["count"] == usage["prompt_tokens"]


BAD = [
    ("logit-bias-out-of-vocab", COMPLETIONS, {"logit_bias": {"10000000": 1}}, "logit_bias", "vocabulary"),
    ("logit-bias-above-100", COMPLETIONS, {"logit_bias": {"1": 101}}, "logit_bias", "[-100, 100]"),
    ("logit-bias-below-minus-100", CHAT, {"logit_bias": {"1": -100.5}}, "logit_bias", "[-100, 100]"),
    ("logit-bias-key-not-an-id", CHAT, {"logit_bias": {"hello": 1}}, "logit_bias", "token ids"),
    # str.isdigit() is true for superscripts, which int() refuses: this was a 500
    ("logit-bias-key-a-superscript-digit", COMPLETIONS, {"logit_bias": {"\u00b2": 1}}, "logit_bias", "token ids"),
    ("suffix-without-fim", COMPLETIONS, {"suffix": "tail"}, "suffix", "fill-in-the-middle"),
    ("best-of-below-n", COMPLETIONS, {"best_of": 1, "n": 2}, "best_of", ">= n"),
    ("audio-modality", CHAT, {"modalities": ["text", "audio"]}, "modalities.1", "text"),
    (
        "tool-without-name",
        CHAT,
        {"tools": [{"type": "function", "function": {"parameters": {}}}]},
        "tools.0.function.name",
        "required",
    ),
    (
        "tool-choice-unknown-function",
        CHAT,
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "launch"}}},
        "tool_choice",
        "launch",
    ),
    ("response-format-unknown-type", CHAT, {"response_format": {"type": "xml"}}, "response_format.type", ""),
    (
        "json-schema-without-schema",
        CHAT,
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format",
        "schema",
    ),
    (
        "tokenize-both-prompt-and-messages",
        "/tokenize",
        {"messages": [{"role": "user", "content": "hi"}]},
        "prompt",
        "exactly one",
    ),
    ("detokenize-out-of-vocab", "/detokenize", {"tokens": [10**7]}, "tokens", "vocabulary"),
]


def _bad_body(server, path, fields):
    if path == COMPLETIONS:
        return {"model": server.model, "prompt": "hello", "max_tokens": 2, **fields}
    if path == CHAT:
        return {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    if path == "/tokenize":
        return {"prompt": "hi", **fields}
    return fields


@pytest.mark.parametrize("path, fields, param, needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_extra_fields_get_a_400_naming_the_field(server, path, fields, param, needle):
    r = httpx.post(server.url + path, json=_bad_body(server, path, fields), timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert needle in error["message"], error


def test_no_block_leaks_after_the_bad_extra_fields(server):
    for _, path, fields, *_ in BAD:
        httpx.post(server.url + path, json=_bad_body(server, path, fields), timeout=30)
    metrics = server.wait_idle()
    assert metrics["pagedinfer_kv_cache_free_blocks"] == metrics["pagedinfer_kv_cache_num_blocks"]
