"""Stream chunks as OpenAI sends them: one finish chunk per choice, `usage: null` until the usage chunk."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

# Common single characters as stop strings: with n=3 and a seed, the choices stop at different steps.
STOPS = [" ", "e", "t", "a", "o", "i", "n", "s", "r", "h", "l", "d", "\n", ".", ",", "c"]


def stream_events(server, path: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    return events


def tokens_per_choice(choice_events: list[dict]) -> Counter:
    """How many tokens each choice streamed (counted from their logprobs, one entry per token).

    Choices of different lengths finished at different engine steps: the case n > 1
    must get right. (Counting chunks instead would depend on timing: a server that
    falls behind its engine sends several steps' tokens of a choice in one chunk.)
    """
    counts: Counter = Counter()
    for c in choice_events:
        logprobs = c.get("logprobs") or {}
        counts[c["index"]] += len(logprobs.get("tokens") or logprobs.get("content") or [])
    return counts


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "Once upon a time", "logprobs": 0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Once upon a time"}], "logprobs": True}),
    ],
    ids=["completions", "chat"],
)
def test_each_choice_of_an_n_stream_sends_exactly_one_finish_chunk(server, path, body):
    body = dict(body, model=server.model, n=3, max_tokens=30, temperature=1.0, seed=1, stop=STOPS, stream=True)
    events = stream_events(server, path, body)
    choices = [c for e in events for c in e["choices"]]
    assert len(set(tokens_per_choice(choices).values())) > 1, tokens_per_choice(choices)  # they end at different steps
    finishes = Counter(c["index"] for c in choices if c["finish_reason"] is not None)
    assert finishes == {0: 1, 1: 1, 2: 1}
    for index in range(3):
        mine = [c for c in choices if c["index"] == index]
        assert mine[-1]["finish_reason"] is not None  # nothing for a choice after its finish chunk


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "Hello"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
    ],
    ids=["completions", "chat"],
)
def test_with_include_usage_every_chunk_carries_null_usage_until_the_last(server, path, body):
    body = dict(
        body, model=server.model, max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    events = stream_events(server, path, body)
    assert len(events) >= 2
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] >= 1


def test_without_include_usage_chunks_have_no_usage_field(server):
    body = {"model": server.model, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True}
    assert all("usage" not in e for e in stream_events(server, "/v1/completions", body))
