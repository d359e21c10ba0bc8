"""The server with `--overlap thread` and `--overlap process`: through the real `openai` client, streams and completions are those of a server
without it (stop strings mid-step, n > 1, logprobs), a hang-up frees its blocks, and no block is leaked."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import openai
import pytest
from serving_harness import serve_app, start_server, stop_server, wait_healthy

STOPS = [" t", "e", "a", "o"]  # common enough that the three seeded choices stop at different steps


def output_processes() -> set[int]:
    """The pids of this process's output-process children (engine/overlap/process.py)."""
    pids = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if (
                    int(stat.read().rpartition(")")[2].split()[1]) == os.getpid()
                    and b"overlap.process import serve" in cmdline.read()
                ):
                    pids.add(int(pid))
        except (OSError, ValueError, IndexError):
            continue
    return pids


@pytest.fixture(scope="module", params=["thread", "process"])
def overlap_server(tiny_llama, request):
    before = output_processes()
    running = start_server(tiny_llama, overlap=request.param)
    if request.param == "thread":
        assert "pagedinfer-output" in {t.name for t in threading.enumerate()}  # the engine's output thread runs
    else:
        assert len(output_processes() - before) == 1  # the engine's output process runs
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
        model=overlap_server.model, prompt="Keep talking", max_tokens=200, stream=True, extra_body={"ignore_eos": True}
    )
    pieces = 0
    for _chunk in stream:
        pieces += 1
        if pieces == 3:
            break
    stream.close()
    m = overlap_server.wait_idle()
    assert m["pagedinfer_kv_cache_free_blocks"] == m["pagedinfer_kv_cache_num_blocks"]
    assert m.get("pagedinfer_num_requests_running") == 0


def serve_with_overlap(model_dir, mode: str):
    """(its EngineLoop, a running server): the test reads the loop's failure state."""
    from pagedinfer.contracts.config.engine_config import EngineConfig
    from pagedinfer.engine.server.app import ServerSettings, create_app
    from pagedinfer.engine.server.engine_loop import EngineLoop
    from pagedinfer.engine.server.launcher import engine_factory
    from pagedinfer.engine.server.metrics import ServerMetrics

    config = EngineConfig(
        model=str(model_dir), device="cpu", max_model_len=1024, num_gpu_blocks_override=128, overlap=mode
    )
    metrics = ServerMetrics("tiny")
    loop = EngineLoop(engine_factory(config, "tiny"), observer=metrics)
    running = serve_app(create_app(loop, metrics, ServerSettings()), loop)
    wait_healthy(running)
    return loop, running


def assert_the_stream_fails(running, loop, after_first_chunk, error: str) -> None:
    """A long stream; after_first_chunk() breaks the output side: the stream ends with a 500 event (no hang),
    the loop fails with `error`, /health turns 503."""
    events = []
    body = {"model": "tiny", "prompt": "Keep talking", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", running.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                if len(events) == 1:
                    after_first_chunk()
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "internal_error", events[-3:]
    assert loop.failed.wait(60) and error in str(loop.engine_error)
    assert httpx.get(running.url + "/health", timeout=10).status_code == 503


def test_a_failure_on_the_output_thread_fails_the_stream_and_the_health_check(tiny_llama, monkeypatch):
    """As any engine error: the stream in flight ends with a 500 event, /health turns 503, and the output
    thread is stopped with the engine."""
    from pagedinfer.engine.overlap import side as output_side_module

    fault = threading.Event()
    real_process = output_side_module.process_batch

    def faulty(batch, tokenizer):
        if fault.is_set():
            raise RuntimeError("injected fault in output processing")
        return real_process(batch, tokenizer)

    monkeypatch.setattr(output_side_module, "process_batch", faulty)
    before = set(threading.enumerate())
    loop, running = serve_with_overlap(tiny_llama, "thread")
    try:
        output_threads = [t for t in threading.enumerate() if t.name == "pagedinfer-output" and t not in before]
        assert len(output_threads) == 1
        assert_the_stream_fails(running, loop, fault.set, "injected fault")
        output_threads[0].join(30)
        assert not output_threads[0].is_alive()
    finally:
        stop_server(running)


def test_a_killed_output_process_fails_the_stream_and_the_health_check(tiny_llama):
    """The output process dies mid-stream: as any engine error (above)."""
    before = output_processes()
    loop, running = serve_with_overlap(tiny_llama, "process")
    try:
        (child,) = output_processes() - before
        assert_the_stream_fails(running, loop, lambda: os.kill(child, signal.SIGKILL), "output process: died")
    finally:
        stop_server(running)
