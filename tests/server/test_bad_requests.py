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
    ("invalid-utf8", COMPLETIONS, b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, None, ""),
    ("json-array-body", COMPLETIONS, b"[1, 2, 3]", 400, None, ""),
    ("empty-body", COMPLETIONS, b"", 400, None, ""),
    ("nan-temperature", COMPLETIONS, b'{"model": "tiny", "prompt": "a", "temperature": NaN}', 400,
     "temperature", ""),
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
    ("top-k-zero", COMPLETIONS, ok_completion(top_k=0), 400, "top_k", ""),
    ("min-p-above-one", COMPLETIONS, ok_completion(min_p=1.5), 400, "min_p", ""),
    ("negative-max-tokens", COMPLETIONS, ok_completion(max_tokens=-1), 400, "max_tokens", ""),
    ("huge-max-tokens", COMPLETIONS, ok_completion(max_tokens=10**9), 400, "max_tokens", "max_model_len"),
    ("min-tokens-over-max", COMPLETIONS, ok_completion(min_tokens=5, max_tokens=2), 400, "min_tokens", ""),
    ("empty-prompt", COMPLETIONS, ok_completion(prompt=""), 400, "prompt", "empty"),
    ("empty-prompt-list", COMPLETIONS, ok_completion(prompt=[]), 400, "prompt", ""),
    ("token-id-outside-vocab", COMPLETIONS, ok_completion(prompt=[1, 10**7]), 400, "prompt", "vocabulary"),
    ("negative-token-id", COMPLETIONS, ok_completion(prompt=[1, -5]), 400, "prompt", ""),
    ("prompt-over-max-model-len", COMPLETIONS, ok_completion(prompt=list(range(5, 305))), 400, "prompt",
     "max_model_len"),
    ("5000-prompts", COMPLETIONS, ok_completion(prompt=["hi"] * 5000), 400, "prompt", "at most 256 prompts"),
    ("257-token-id-prompts", COMPLETIONS, ok_completion(prompt=[[1, 2]] * 257), 400, "prompt", "at most 256"),
    ("unknown-field", COMPLETIONS, ok_completion(best_of_all=3), 400, "best_of_all", "unknown field"),
    ("empty-stop", COMPLETIONS, ok_completion(stop=[""]), 400, None, "stop"),
    ("stream-options-without-stream", COMPLETIONS, ok_completion(stream_options={"include_usage": True}), 400,
     None, "stream_options"),
    ("unknown-model", COMPLETIONS, ok_completion(model="gpt-17"), 404, "model", "gpt-17"),
    ("empty-messages", CHAT, ok_chat(messages=[]), 400, "messages", ""),
    ("message-bad-role", CHAT, ok_chat(messages=[{"role": "wizard", "content": "hi"}]), 400,
     "messages.0.role", ""),
    ("message-missing-content", CHAT, ok_chat(messages=[{"role": "user"}]), 400, "messages.0.content", ""),
    ("top-logprobs-without-logprobs", CHAT, ok_chat(top_logprobs=2), 400, None, "top_logprobs"),
    ("chat-huge-max-completion-tokens", CHAT, ok_chat(max_completion_tokens=10**6), 400, "max_tokens",
     "max_model_len"),
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


def test_non_json_content_type_is_a_400(server):
    r = httpx.post(server.url + COMPLETIONS, content=b"model=tiny", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400
    assert r.json()["error"]["message"]


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
