"""The engine's own limits are checked before any response starts, and what the engine still refuses is named.

The server here runs a model whose tokenizer has one added token beyond the
model's vocabulary (len(tokenizer) = vocab_size + 1) and `max_num_seqs=2`.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading

import httpx
import pytest
from serving_harness import start_server, stop_server

ADDED_TOKEN = "<tool_call>"


@pytest.fixture(scope="module")
def added_token_model(tiny_llama, tmp_path_factory):
    from transformers import AutoTokenizer

    model_dir = tmp_path_factory.mktemp("added_token") / "model"
    shutil.copytree(tiny_llama, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab_size = len(tokenizer)
    tokenizer.add_tokens([ADDED_TOKEN])
    tokenizer.save_pretrained(str(model_dir))
    assert len(AutoTokenizer.from_pretrained(str(model_dir))) == vocab_size + 1
    return model_dir, vocab_size


@pytest.fixture(scope="module")
def limited(added_token_model):
    model_dir, _ = added_token_model
    running = start_server(model_dir, max_num_seqs=2)
    yield running
    stop_server(running)


@pytest.fixture
def swapped_info(limited):
    """Replace fields of the server's ModelInfo for one test (the engine itself is untouched)."""
    original = limited.engine_loop.info

    def swap(**fields):
        limited.engine_loop.info = dataclasses.replace(original, **fields)

    yield swap
    limited.engine_loop.info = original


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=dict(body, model=server.model), timeout=60)


def completion(**fields) -> dict:
    return dict({"prompt": "hello", "max_tokens": 2}, **fields)


def chat(content: str = "hi", **fields) -> dict:
    return dict({"messages": [{"role": "user", "content": content}], "max_tokens": 2}, **fields)


def assert_400_naming(r: httpx.Response, param: str, needle: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_parameter", error
    assert needle in error["message"], error


@pytest.mark.parametrize("stream", [False, True])
def test_n_above_max_num_seqs_is_a_400_before_the_stream_starts(limited, stream):
    assert_400_naming(post(limited, "/v1/completions", completion(n=3, stream=stream)), "n", "max_num_seqs")
    assert_400_naming(post(limited, "/v1/chat/completions", chat(n=3, stream=stream)), "n", "max_num_seqs")
    assert post(limited, "/v1/completions", completion(n=2, stream=stream)).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_token_ids_the_tokenizer_knows_but_the_model_does_not_are_a_400(limited, added_token_model, stream):
    _, vocab_size = added_token_model
    r = post(limited, "/v1/completions", completion(prompt=[1, vocab_size], stream=stream))
    assert_400_naming(r, "prompt", f"token id {vocab_size}")
    assert post(limited, "/v1/completions", completion(prompt=[1, vocab_size - 1])).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_text_that_tokenizes_to_an_added_token_beyond_the_model_is_a_400(limited, added_token_model, stream):
    _, vocab_size = added_token_model
    r = post(limited, "/v1/completions", completion(prompt=f"call {ADDED_TOKEN} now", stream=stream))
    assert_400_naming(r, "prompt", f"tokenizes to token id {vocab_size}")
    r = post(limited, "/v1/chat/completions", chat(f"call {ADDED_TOKEN} now", stream=stream))
    assert_400_naming(r, "messages", f"tokenizes to token id {vocab_size}")


def test_a_request_the_engine_refuses_gets_a_full_error_body(limited, swapped_info):
    """With the server's own check out of the way, the engine's ValueError comes back named, with a code."""
    swapped_info(max_num_seqs=16)
    r = post(limited, "/v1/completions", completion(n=3))
    assert_400_naming(r, "n", "max_num_seqs=2")
    with httpx.stream(
        "POST",
        limited.url + "/v1/completions",
        json=dict(completion(n=3, stream=True), model=limited.model),
        timeout=60,
    ) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert '"param":"n"' in events[-2] and '"code":"invalid_parameter"' in events[-2]


class HeldTokenizer:
    """Delegates to a tokenizer; encode says it started (`encoding`) and waits for `release`, as a huge prompt's
    encode would take its time."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.encoding, self.release = threading.Event(), threading.Event()

    def encode(self, *args, **kwargs):
        self.encoding.set()
        self.release.wait(60)
        return self._tokenizer.encode(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __len__(self) -> int:
        return len(self._tokenizer)


def test_tokenizing_a_prompt_does_not_block_other_requests(limited, swapped_info):
    tokenizer = HeldTokenizer(limited.engine_loop.info.tokenizer)
    swapped_info(tokenizer=tokenizer)
    slow = threading.Thread(target=post, args=(limited, "/v1/completions", completion()))
    slow.start()
    try:
        assert tokenizer.encoding.wait(30), "the request never started tokenizing"
        # held until /health has answered: a server tokenizing on its event loop could not answer it
        assert httpx.get(limited.url + "/health", timeout=10).status_code == 200
    finally:
        tokenizer.release.set()
        slow.join(30)


def test_a_model_the_grammar_backend_cannot_serve_starts_and_refuses_structured_requests_with_a_400(limited):
    """Its tokenizer holds a token beyond the model's vocabulary: llguidance cannot build its view of it. The
    server's start-up set-up of the backend logs that and serves everything else; a structured request is a 400."""
    r = post(limited, "/v1/completions", completion(prompt="hi", response_format={"type": "json_object"}))
    assert r.status_code == 400, r.text
    assert "vocab" in r.json()["error"]["message"]
    assert post(limited, "/v1/completions", completion(prompt="hi")).status_code == 200
