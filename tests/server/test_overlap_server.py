"""The server with `--overlap`: through the real `openai` client, streams and completions are those of a server
without it (stop strings mid-step, n > 1, logprobs), a hang-up frees its blocks, and no block is leaked."""

from __future__ import annotations

import threading

import openai
import pytest
from serving_harness import start_server, stop_server

STOPS = [" t", "e", "a", "o"]  # common enough that the three seeded choices stop at different steps


@pytest.fixture(scope="module")
def overlap_server(tiny_llama):
    running = start_server(tiny_llama, overlap=True)
    assert "pagedinfer-output" in {t.name for t in threading.enumerate()}  # the engine's output thread runs
    yield running
    stop_server(running)


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def streamed(server, **body) -> dict[int, tuple[str, str | None]]:
    """Per choice: its streamed text and its finish reason (how the text is cut into chunks depends on when
    the handler reads its queue: several steps' deltas may go out as one chunk)."""
    choices: dict[int, tuple[list[str], str | None]] = {}
    for chunk in client_of(server).completions.create(model=server.model, stream=True, **body):
        for c in chunk.choices:
            pieces, finish = choices.setdefault(c.index, ([], None))
            if c.text:
                pieces.append(c.text)
            choices[c.index] = (pieces, c.finish_reason or finish)
    return {index: ("".join(pieces), finish) for index, (pieces, finish) in choices.items()}


@pytest.mark.slow  # the one end-to-end proof of --overlap through the server (a second server starts)
def test_streams_equal_those_of_a_server_without_overlap(server, overlap_server):
    body = dict(prompt="Once upon a time", n=3, max_tokens=24, temperature=1.0, seed=7, stop=STOPS)
    want, got = streamed(server, **body), streamed(overlap_server, **body)
    assert got == want
    assert {finish for _, finish in got.values()} <= {"stop", "length"} and len(got) == 3
    assert any(finish == "stop" for _, finish in got.values())  # a stop string ended one mid-output
    assert not any(stop in text for text, _ in got.values() for stop in STOPS)  # no text past a stop
    greedy = dict(prompt="Hello", max_tokens=12, temperature=0, logprobs=2, stop=[" the", "e"])
    assert streamed(overlap_server, **greedy) == streamed(server, **greedy)
    plain = [client_of(s).completions.create(model=s.model, **greedy) for s in (server, overlap_server)]
    assert plain[1].choices[0].text == plain[0].choices[0].text
    assert plain[1].choices[0].logprobs.tokens == plain[0].choices[0].logprobs.tokens
    m = overlap_server.wait_idle()
    assert m["pagedinfer_kv_cache_free_blocks"] == m["pagedinfer_kv_cache_num_blocks"]


def test_a_hang_up_mid_stream_frees_the_requests_blocks(overlap_server):
    stream = client_of(overlap_server).completions.create(
        model=overlap_server.model, prompt="Keep talking", max_tokens=200, stream=True,
        extra_body={"ignore_eos": True})
    pieces = 0
    for chunk in stream:
        pieces += 1
        if pieces == 3:
            break
    stream.close()
    m = overlap_server.wait_idle()
    assert m["pagedinfer_kv_cache_free_blocks"] == m["pagedinfer_kv_cache_num_blocks"]
    assert m.get("pagedinfer_num_requests_running") == 0
