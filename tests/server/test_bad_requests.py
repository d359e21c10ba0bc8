"""Bad input gets the right 4xx in OpenAI's error shape, naming the problem; the server stays healthy."""

from __future__ import annotations

import json

import httpx
import pytest

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def ok_completion(**fields):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
    body.update(fields)
    return body


def ok_chat(**fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body.update(fields)
    return body


# (id, path, json body or raw bytes, expected status, expected param or None, text the message must contain)
CASES = [
    ("malformed-json", COMPLETIONS, b'{"model": "tiny", "prompt": ', 400, None, "malformed JSON"),
    ("invalid-utf8", COMPLETIONS, b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, None, "not valid UTF-8"),
    (
        "deeply-nested-json",
        COMPLETIONS,
        b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        None,
        "nested too deeply",
    ),
    (
        "integer-with-5000-digits",
        COMPLETIONS,
        b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"1" * 5000 + b"}",
        400,
        None,
        "more than 4300 digits",
    ),
    ("lone-surrogate-prompt", COMPLETIONS, b'{"model": "tiny", "prompt": "\\ud800"}', 400, "prompt", "surrogate"),
    (
        "lone-surrogate-in-prompt-list",
        COMPLETIONS,
        b'{"model": "tiny", "prompt": ["ok", "a\\udfffb"]}',
        400,
        "prompt",
        "surrogate",
    ),
    (
        "lone-surrogate-chat",
        CHAT,
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00"}]}',
        400,
        "messages.0.content",
        "surrogate",
    ),
    (
        "lone-surrogate-chat-part",
        CHAT,
        b'{"model": "tiny", "messages": [{"role": "system", "content": "hi"}, '
        b'{"role": "user", "content": [{"type": "text", "text": "x\\ud800"}]}]}',
        400,
        "messages.1.content",
        "surrogate",
    ),
    ("lone-surrogate-model", COMPLETIONS, b'{"model": "\\ud800", "prompt": "hi"}', 404, "model", "does not exist"),
    (
        "lone-surrogate-field-name",
        COMPLETIONS,
        b'{"model": "tiny", "prompt": "hi", "\\udc00": 1}',
        400,
        None,
        "unicode string",
    ),
    ("json-array-body", COMPLETIONS, b"[1, 2, 3]", 400, None, ""),
    ("empty-body", COMPLETIONS, b"", 400, None, ""),
    ("nan-temperature", COMPLETIONS, b'{"model": "tiny", "prompt": "a", "temperature": NaN}', 400, "temperature", ""),
    ("missing-model", COMPLETIONS, {"prompt": "hi"}, 400, "model", "required"),
    ("missing-prompt", COMPLETIONS, {"model": "tiny"}, 400, "prompt", "required"),
    ("temperature-wrong-type", COMPLETIONS, ok_completion(temperature="hot"), 400, "temperature", ""),
    ("max-tokens-string", COMPLETIONS, ok_completion(max_tokens="5"), 400, "max_tokens", ""),
    ("n-float", COMPLETIONS, ok_completion(n=1.5), 400, "n", ""),
    ("stream-wrong-type", COMPLETIONS, ok_completion(stream="yes"), 400, "stream", ""),
    ("prompt-wrong-type", COMPLETIONS, ok_completion(prompt={"text": "hi"}), 400, "prompt", ""),
    ("temperature-too-high", COMPLETIONS, ok_completion(temperature=5), 400, "temperature", "less than"),
    ("top-p-zero", COMPLETIONS, ok_completion(top_p=0), 400, "top_p", ""),
    ("n-zero", COMPLETIONS, ok_completion(n=0), 400, "n", ""),
    ("huge-n", COMPLETIONS, ok_completion(n=100000), 400, "n", ""),
    ("presence-penalty", COMPLETIONS, ok_completion(presence_penalty=3), 400, "presence_penalty", ""),
    ("logprobs-too-many", COMPLETIONS, ok_completion(logprobs=50), 400, "logprobs", ""),
    ("top-k-minus-two", COMPLETIONS, ok_completion(top_k=-2), 400, "top_k", ""),
    ("min-p-above-one", COMPLETIONS, ok_completion(min_p=1.5), 400, "min_p", ""),
    ("negative-max-tokens", COMPLETIONS, ok_completion(max_tokens=-1), 400, "max_tokens", ""),
    ("huge-max-tokens", COMPLETIONS, ok_completion(max_tokens=10**9), 400, "max_tokens", "max_model_len"),
    ("min-tokens-over-max", COMPLETIONS, ok_completion(min_tokens=5, max_tokens=2), 400, "min_tokens", ""),
    ("empty-prompt", COMPLETIONS, ok_completion(prompt=""), 400, "prompt", "empty"),
    ("empty-prompt-list", COMPLETIONS, ok_completion(prompt=[]), 400, "prompt", ""),
    ("token-id-outside-vocab", COMPLETIONS, ok_completion(prompt=[1, 10**7]), 400, "prompt", "vocabulary"),
    ("negative-token-id", COMPLETIONS, ok_completion(prompt=[1, -5]), 400, "prompt", ""),
    (
        "prompt-over-max-model-len",
        COMPLETIONS,
        ok_completion(prompt=list(range(5, 305))),
        400,
        "prompt",
        "max_model_len",
    ),
    ("5000-prompts", COMPLETIONS, ok_completion(prompt=["hi"] * 5000), 400, "prompt", "at most 256 prompts"),
    ("257-token-id-prompts", COMPLETIONS, ok_completion(prompt=[[1, 2]] * 257), 400, "prompt", "at most 256"),
    ("unknown-field", COMPLETIONS, ok_completion(best_of_all=3), 400, "best_of_all", "unknown field"),
    ("empty-stop", COMPLETIONS, ok_completion(stop=[""]), 400, None, "stop"),
    (
        "stream-options-without-stream",
        COMPLETIONS,
        ok_completion(stream_options={"include_usage": True}),
        400,
        None,
        "stream_options",
    ),
    ("unknown-model", COMPLETIONS, ok_completion(model="gpt-17"), 404, "model", "gpt-17"),
    ("empty-messages", CHAT, ok_chat(messages=[]), 400, "messages", ""),
    ("message-bad-role", CHAT, ok_chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role", ""),
    ("message-missing-content", CHAT, ok_chat(messages=[{"role": "user"}]), 400, "messages.0.content", ""),
    ("top-logprobs-without-logprobs", CHAT, ok_chat(top_logprobs=2), 400, None, "top_logprobs"),
    (
        "chat-huge-max-completion-tokens",
        CHAT,
        ok_chat(max_completion_tokens=10**6),
        400,
        "max_completion_tokens",
        "max_model_len",
    ),
    ("chat-huge-max-tokens", CHAT, ok_chat(max_tokens=10**6), 400, "max_tokens", "max_model_len"),
    (
        "user-content-null",
        CHAT,
        ok_chat(messages=[{"role": "user", "content": None}]),
        400,
        "messages.0.content",
        "null",
    ),
    ("chat-unknown-field", CHAT, ok_chat(functions=[]), 400, "functions", "unknown field"),
]


@pytest.mark.parametrize("path, body, status, param, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_gets_a_named_4xx_in_openai_shape(server, path, body, status, param, needle):
    if isinstance(body, bytes):
        r = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    else:
        r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == ("invalid_request_error" if status == 400 else "not_found_error")
    if param is not None:
        assert error["param"] == param, error
        assert param.split(".")[0] in error["message"]
    assert needle in error["message"]


def test_wrong_method_and_unknown_path_use_the_error_shape(server):
    r = httpx.get(server.url + COMPLETIONS)
    assert r.status_code == 405
    assert r.json()["error"]["message"]
    r = httpx.get(server.url + "/v2/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_declared_json_is_a_415_naming_content_type(server, content_type):
    body = json.dumps(ok_completion()).encode()
    headers = {"Content-Type": content_type} if content_type else {}
    r = httpx.post(server.url + COMPLETIONS, content=body, headers=headers)
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "unsupported_media_type"
    assert "Content-Type: must be application/json" in error["message"]
    assert (content_type or "none was sent") in error["message"]


def test_json_media_types_with_parameters_or_a_json_suffix_are_accepted(server):
    body = json.dumps(ok_completion()).encode()
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = httpx.post(server.url + COMPLETIONS, content=body, headers={"Content-Type": content_type})
        assert r.status_code == 200, (content_type, r.text)


# Fields OpenAI declares nullable: null means the default, as vLLM treats it.
NULLABLE = [
    (
        COMPLETIONS,
        ok_completion(
            n=None,
            stream=None,
            ignore_eos=None,
            min_tokens=None,
            temperature=None,
            top_p=None,
            seed=None,
            stop=None,
            logprobs=None,
            user=None,
            stream_options=None,
            presence_penalty=None,
            frequency_penalty=None,
            top_k=None,
            min_p=None,
            repetition_penalty=None,
        ),
    ),
    (
        CHAT,
        ok_chat(
            n=None,
            stream=None,
            logprobs=None,
            top_logprobs=None,
            ignore_eos=None,
            min_tokens=None,
            max_completion_tokens=None,
        ),
    ),
    (
        CHAT,
        ok_chat(
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "again", "name": None},
            ]
        ),
    ),
]


@pytest.mark.parametrize("path, body", NULLABLE, ids=["completions", "chat", "assistant-content"])
def test_null_optional_fields_mean_their_defaults(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1


@pytest.mark.parametrize("top_k", [-1, 0])
def test_vllms_spellings_of_no_top_k_are_accepted(server, top_k):
    r = httpx.post(server.url + COMPLETIONS, json=ok_completion(top_k=top_k, temperature=1.0), timeout=30)
    assert r.status_code == 200, r.text


def test_null_max_tokens_of_a_completion_is_the_default_16(server):
    """OpenAI's completions default max_tokens to 16; null means that default, not max_model_len."""
    r = httpx.post(server.url + COMPLETIONS, json=ok_completion(max_tokens=None, ignore_eos=True), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_null_stream_flags_mean_their_defaults(server):
    body = ok_completion(stream=True, stream_options={"include_usage": None})
    with httpx.stream("POST", server.url + COMPLETIONS, json=body, timeout=30) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert all('"usage":{' not in e for e in events)  # include_usage null is false


def test_server_stays_healthy_and_frees_every_block_after_the_battery(server):
    for _, path, body, *_ in CASES:
        if isinstance(body, bytes):
            httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
        else:
            httpx.post(server.url + path, json=body, timeout=30)
    assert httpx.get(server.url + "/health").status_code == 200
    good = httpx.post(server.url + COMPLETIONS, json=ok_completion(), timeout=30)
    assert good.status_code == 200, good.text
    metrics = server.wait_idle()
    assert metrics["pagedinfer_kv_cache_free_blocks"] == metrics["pagedinfer_kv_cache_num_blocks"]
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0
    assert json.loads(good.text)["choices"][0]["finish_reason"] in ("length", "stop")
