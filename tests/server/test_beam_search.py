"""use_beam_search on the OpenAI endpoints, through the official openai client and raw HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from pagedinfer.engine import LLM
from pagedinfer.engine.beam.group import max_group_blocks
from pagedinfer.engine.beam.params import BeamSearchParams

PROMPT = [11, 52, 143, 200, 7, 99, 310, 18, 64, 5]


def test_completions_return_the_n_best_beams_best_first(openai_client, server, tiny_llama):
    out = openai_client.completions.create(
        model=server.model,
        prompt=PROMPT,
        max_tokens=8,
        n=3,
        extra_body={"use_beam_search": True, "length_penalty": 0.5, "ignore_eos": True},
    )
    offline = LLM(model=str(tiny_llama), device="cpu", max_model_len=256, block_size=16).beam_search(
        [PROMPT], BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True, length_penalty=0.5)
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [s.text for s in offline[0].sequences]
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.completion_tokens == 3 * 8


def test_chat_accepts_beam_search(openai_client, server):
    out = openai_client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=6,
        n=2,
        extra_body={"use_beam_search": True},
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.finish_reason in ("stop", "length") for c in out.choices)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"stream": True}, "stream"),
        ({"temperature": 0.8}, "temperature"),
        ({"top_p": 0.9}, "top_p"),
        ({"seed": 3}, "seed"),
        ({"stop": ["x"]}, "stop"),
        ({"logprobs": 0}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"guided_regex": "[ab]+"}, "guided_regex"),
    ],
)
def test_beam_search_with_a_field_that_does_not_apply_is_a_400_naming_it(server, fields, param):
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 4, "n": 2, "use_beam_search": True, **fields}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_length_penalty_without_beam_search_is_a_400(openai_client, server):
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=4, extra_body={"length_penalty": 0.5}
        )
    assert err.value.body["param"] == "length_penalty"


def test_beam_search_with_temperature_zero_and_n_one_is_accepted(server):
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 4, "use_beam_search": True, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1


def test_more_beams_than_max_num_seqs_or_the_pool_holds_is_a_400_naming_n(tiny_llama):
    from serving_harness import start_server, stop_server

    running = start_server(tiny_llama, max_num_seqs=4, num_gpu_blocks_override=40)
    try:
        body = {"model": running.model, "prompt": PROMPT, "max_tokens": 4, "use_beam_search": True}
        r = httpx.post(running.url + "/v1/completions", json={**body, "n": 5}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
        r = httpx.post(running.url + "/v1/completions", json={**body, "n": 4}, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"]) == 4, r.text
        # 4 beams of 200 tokens could need more than the pool's 40 blocks of 16: refused before queueing
        r = httpx.post(running.url + "/v1/completions", json={**body, "n": 4, "max_tokens": 200}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
        assert "KV blocks" in r.json()["error"]["message"]
        # the longest of several prompts is not the one whose beams need most: with 144 tokens, a 32-token
        # prompt's 4 beams need at most 38 blocks, a 17-token one's 41 (each beam owns its partial block)
        assert [max_group_blocks(p, BeamSearchParams(4, 144), 16) for p in (32, 17)] == [38, 41]
        prompts = [PROMPT * 3 + PROMPT[:2], PROMPT + PROMPT[:7]]
        r = httpx.post(
            running.url + "/v1/completions", json={**body, "prompt": prompts, "n": 4, "max_tokens": 144}, timeout=30
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    finally:
        stop_server(running)
