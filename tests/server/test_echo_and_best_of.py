"""Completions echo (the prompt and its logprobs, as evaluation harnesses score them), best_of and prompt_logprobs."""

from __future__ import annotations

import httpx
import pytest
import torch
import transformers

COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def reference(tiny_llama):
    """transformers' own logprobs of each prompt token given its prefix."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()

    def logprobs_of(ids):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)

    return logprobs_of


def post(server, **body):
    r = httpx.post(server.url + COMPLETIONS, json={"model": server.model, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_returns_the_prompt_and_its_token_logprobs_in_openais_shape(openai_client, server, reference):
    prompt = [11, 57, 93, 140, 201, 7, 66]
    out = openai_client.completions.create(
        model=server.model, prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    choice = out.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt) + 1 and len(lp.token_logprobs) == len(prompt) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = reference(prompt)
    for position in range(1, len(prompt)):
        assert lp.token_logprobs[position] == pytest.approx(float(expected[position - 1, prompt[position]]), abs=1e-4)
        assert max(lp.top_logprobs[position].values()) == pytest.approx(float(expected[position - 1].max()), abs=1e-4)
    decoded = httpx.post(server.url + "/detokenize", json={"tokens": prompt}, timeout=30).json()["prompt"]
    assert choice.text.startswith(decoded)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] == len(decoded)


def test_echo_with_max_tokens_zero_scores_the_prompt_alone(server, reference):
    prompt = "The quick brown fox"
    out = post(server, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    choice = out["choices"][0]
    assert choice["text"] == prompt
    assert out["usage"]["completion_tokens"] == 0
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
    assert len(choice["logprobs"]["token_logprobs"]) == len(ids)
    expected = reference(ids)
    total = sum(choice["logprobs"]["token_logprobs"][1:])
    assert total == pytest.approx(sum(float(expected[i - 1, ids[i]]) for i in range(1, len(ids))), abs=1e-3)


def test_max_tokens_zero_without_echo_is_a_400(server):
    r = httpx.post(server.url + COMPLETIONS, json={"model": server.model, "prompt": "x", "max_tokens": 0}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_streamed_echo_concatenates_to_the_whole_response(server):
    body = {"model": server.model, "prompt": "A paged KV cache", "max_tokens": 5, "temperature": 0, "echo": True}
    whole = post(server, **{k: v for k, v in body.items() if k != "model"})["choices"][0]["text"]
    with httpx.stream("POST", server.url + COMPLETIONS, json={**body, "stream": True}, timeout=60) as r:
        pieces = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    import json

    assert "".join(json.loads(p)["choices"][0]["text"] for p in pieces) == whole
    assert whole.startswith("A paged KV cache")


def test_streamed_echo_logprobs_concatenate_to_the_whole_responses(server):
    # every chunk's text_offset counts the echoed prompt: a chunk's first offset is where its text starts in
    # the whole streamed text (it counted the generated text only, after the first chunk)
    body = {
        "model": server.model,
        "prompt": "A paged KV cache",
        "max_tokens": 6,
        "temperature": 0,
        "echo": True,
        "logprobs": 1,
        "n": 2,
    }
    whole = post(server, **{k: v for k, v in body.items() if k != "model"})["choices"]
    import json

    streamed = {c["index"]: {"text": "", "tokens": [], "token_logprobs": [], "chunk_starts": []} for c in whole}
    with httpx.stream("POST", server.url + COMPLETIONS, json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    got, logprobs = streamed[choice["index"]], choice["logprobs"]
                    if logprobs and logprobs["tokens"]:
                        got["chunk_starts"].append((logprobs["text_offset"][0], len(got["text"])))
                        got["tokens"] += logprobs["tokens"]
                        got["token_logprobs"] += logprobs["token_logprobs"]
                    got["text"] += choice["text"]
    for c in whole:
        got = streamed[c["index"]]
        assert got["text"] == c["text"] and got["tokens"] == c["logprobs"]["tokens"]
        assert got["token_logprobs"] == c["logprobs"]["token_logprobs"]
        assert len(got["chunk_starts"]) > 1  # the generated tokens came in chunks of their own
        assert all(offset == before for offset, before in got["chunk_starts"]), got["chunk_starts"]


def test_best_of_returns_the_completions_with_the_highest_cumulative_logprob(openai_client, server):
    common = dict(
        model=server.model, prompt="Numbers:", max_tokens=5, temperature=1.0, seed=11, extra_body={"ignore_eos": True}
    )
    every = openai_client.completions.create(n=4, logprobs=0, **common).choices
    scores = {c.text: sum(c.logprobs.token_logprobs) for c in every}
    best = openai_client.completions.create(n=2, best_of=4, logprobs=0, **common).choices
    assert [c.index for c in best] == [0, 1]
    assert [c.text for c in best] == sorted(scores, key=scores.get, reverse=True)[:2]
    plain = openai_client.completions.create(n=1, best_of=4, **common).choices
    assert plain[0].text == best[0].text and plain[0].logprobs is None


def test_vllm_prompt_logprobs_field_reports_each_prompt_token(server, reference):
    prompt = [20, 30, 40, 50]
    choice = post(server, prompt=prompt, max_tokens=1, prompt_logprobs=2)["choices"][0]
    steps = choice["prompt_logprobs"]
    assert steps[0] is None and len(steps) == len(prompt)
    expected = reference(prompt)
    for position in range(1, len(prompt)):
        entry = steps[position][str(prompt[position])]
        assert entry["logprob"] == pytest.approx(float(expected[position - 1, prompt[position]]), abs=1e-4)
        assert len(steps[position]) <= 3
