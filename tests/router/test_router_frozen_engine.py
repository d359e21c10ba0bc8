"""A frozen engine (SIGSTOP: a hung device, a partition) holds no request behind the router.

Two real engine processes behind a real `pagedinfer router` process, round-robin so that both get requests;
one is frozen while a batch is in flight. Every request either completes with the answer the other engine
gives, or (a stream that had started on the frozen engine) ends with the `upstream_broken` error event. A
request that got no byte from the frozen engine is retried, never one that did (it would run twice).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor, as_completed

import httpx
import openai
import pytest
from engine_process import serve_process
from health_witness import HealthWitness
from router_harness import route_of, start_router, start_router_process, wait_for

from pagedinfer.testing.server_process import free_port, wait_process_healthy

FIRST_BYTE_TIMEOUT_SECONDS = 1.0
CLIENT_TIMEOUT_SECONDS = 30.0  # the old router held such requests for its 300 s read timeout
NUM_REQUESTS, NUM_CONCURRENT = 20, 4


@pytest.fixture(scope="module")
def engines(tiny_llama, tmp_path_factory):
    logs = tmp_path_factory.mktemp("frozen-engines")
    running = []
    try:
        for i in range(2):
            url = f"http://127.0.0.1:{free_port()}"
            running.append((url, serve_process(tiny_llama, int(url.rsplit(":", 1)[1]), logs / f"engine{i}.log")))
        for url, proc in running:
            wait_process_healthy(url, proc, log_path=logs / "engine0.log")
        yield running
    finally:
        for _, proc in running:
            proc.send_signal(signal.SIGCONT)  # never leave a stopped process behind
            proc.kill()
            proc.wait(30)


@pytest.fixture
def router(engines, tiny_llama, tmp_path):
    with _router_process([url for url, _ in engines], tiny_llama, tmp_path) as running:
        yield running


@contextlib.contextmanager
def _router_process(engine_urls, tiny_llama, tmp_path):
    """`pagedinfer router` (round-robin, logging at INFO) over `engine_urls`; (its URL, its log) once every
    engine is healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "router.log"
    args = [
        "--tokenizer",
        str(tiny_llama),
        "--port",
        str(port),
        "--policy",
        "round-robin",
        "--log-level",
        "info",
        "--upstream-first-byte-timeout-seconds",
        str(FIRST_BYTE_TIMEOUT_SECONDS),
    ]
    for engine_url in engine_urls:
        args += ["--engine", engine_url]
    proc = start_router_process(url, args, log)
    try:
        wait_for(lambda: _healthy_engines(url) == len(engine_urls), "the router never saw every engine healthy")
        yield url, log
    finally:
        proc.terminate()
        proc.wait(30)


def _healthy_engines(router_url: str) -> int:
    metrics = httpx.get(router_url + "/metrics", timeout=5).text
    return len(re.findall(r"^pagedinfer_router_engine_healthy\{[^}]*\} 1\.0$", metrics, re.MULTILINE))


def _retries(router_url: str) -> float:
    metrics = httpx.get(router_url + "/metrics", timeout=5).text
    return float(re.search(r"^pagedinfer_router_retries_total (\S+)$", metrics, re.MULTILINE).group(1))


def _prompt(i: int) -> str:
    return f"Request number {i} asks the tiny model to keep talking"


def _ask(client: openai.OpenAI, i: int) -> tuple[str, str | None]:
    """(text, None) for a complete answer, or (text so far, the error code) for a stream that ended in error."""
    body = dict(model="tiny", prompt=_prompt(i), max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    if i % 2 == 0:
        return client.completions.create(**body).choices[0].text, None
    text = ""
    try:
        for chunk in client.completions.create(**body, stream=True):
            text += chunk.choices[0].text if chunk.choices else ""
    except openai.APIError as exc:
        return text, (exc.body or {}).get("code") if isinstance(exc.body, dict) else repr(exc)
    return text, None


def test_requests_on_a_frozen_engine_are_retried_or_end_with_upstream_broken_and_none_hangs(engines, router):
    router_url, _ = router
    (frozen_url, frozen), (live_url, _) = engines
    reference = openai.OpenAI(
        base_url=live_url + "/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS
    )
    expected = {i: _ask(reference, i)[0] for i in range(NUM_REQUESTS)}  # greedy: both engines agree
    client = openai.OpenAI(base_url=router_url + "/v1", api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_SECONDS)
    try:
        with ThreadPoolExecutor(NUM_CONCURRENT) as pool:
            futures = {pool.submit(_ask, client, i): i for i in range(NUM_REQUESTS)}
            wait_for(lambda: any(f.done() for f in futures), "no request ever finished")
            os.kill(frozen.pid, signal.SIGSTOP)  # the others of the first round are in flight, on both engines
            outcomes = {futures[f]: f.result() for f in as_completed(futures)}  # a hung one: the client's timeout
        broken = {i for i, (_, code) in outcomes.items() if code is not None}
        assert {code for _, code in outcomes.values()} <= {None, "upstream_broken"}, outcomes
        assert broken <= {i for i in range(NUM_REQUESTS) if i % 2 == 1}, outcomes  # streams only
        for i, (text, code) in outcomes.items():
            if code is None:
                assert text == expected[i], (i, text, expected[i])
            else:
                assert expected[i].startswith(text), (i, text, expected[i])  # what came is the right answer's start
        assert NUM_REQUESTS - len(broken) >= NUM_REQUESTS - NUM_CONCURRENT  # at most the first round broke
        assert _retries(router_url) >= 1  # round-robin sent some to the frozen engine; they came back
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    wait_for(lambda: _healthy_engines(router_url) == 2, "the thawed engine never came back")


def test_the_router_logs_an_engines_drop_and_return_once_each_and_no_health_check(engines, tiny_llama, tmp_path):
    (frozen_url, frozen), (live_url, _) = engines
    with (
        HealthWitness() as witness,
        _router_process([frozen_url, live_url, witness.url], tiny_llama, tmp_path) as (router_url, log),
    ):
        # the witness answers the same supervisor loop as the engines: after its first check (healthy), the
        # next ones changed nothing, as the engines' did meanwhile
        wait_for(lambda: witness.checks >= 3, "the router stopped checking its engines' health")
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _healthy_engines(router_url) == 2, "the frozen engine was never dropped")
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        wait_for(lambda: _healthy_engines(router_url) == 3, "the thawed engine never came back")
    lines = log.read_text().splitlines()
    assert not [line for line in lines if "/health" in line or "HTTP Request" in line], lines
    assert len([line for line in lines if f"engine {frozen_url} dropped" in line]) == 1, lines
    assert len([line for line in lines if f"engine {frozen_url} healthy again" in line]) == 1, lines


def test_a_stream_whose_headers_miss_the_first_byte_bound_is_retried_on_another_engine(
    engines, tiny_llama, monkeypatch
):
    """Health checks that cannot see the freeze (a 120 s timeout here): the first-byte bound alone retries."""
    monkeypatch.setattr("pagedinfer.router.state.HEALTH_TIMEOUT_SECONDS", 120.0)
    (frozen_url, frozen), (live_url, _) = engines
    router = start_router([frozen_url, live_url], tiny_llama, policy="round-robin", first_byte_timeout_seconds=0.5)
    body = {"model": "tiny", "prompt": _prompt(0), "max_tokens": 8, "temperature": 0, "stream": True}
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        for _ in range(2):  # round-robin: at least one of the two is sent to the frozen engine first
            with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=CLIENT_TIMEOUT_SECONDS) as r:
                assert r.status_code == 200 and route_of(r)["engine"] == live_url
                lines = [line for line in r.iter_lines() if line]
            assert lines[-1] == "data: [DONE]" and "upstream_broken" not in "".join(lines)
        state = router.app.state.router
        assert state.engines[frozen_url].healthy  # not dropped: the bound, not a health check, gave it up
        assert _retries(router.url) >= 1  # one, or both if the turns put each on the frozen engine first
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        router.stop()


def test_a_started_stream_on_an_engine_that_freezes_ends_with_upstream_broken_once_it_is_dropped(engines, tiny_llama):
    (frozen_url, frozen), (live_url, _) = engines
    router = start_router([frozen_url, live_url], tiny_llama, policy="round-robin")
    body = {"model": "tiny", "prompt": _prompt(0), "max_tokens": 900, "ignore_eos": True, "stream": True}
    try:
        for _ in range(2):  # round-robin: one of two consecutive streams starts on the engine to freeze
            with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=CLIENT_TIMEOUT_SECONDS) as r:
                if route_of(r)["engine"] != frozen_url:
                    continue
                lines = []
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                    if len(lines) == 3:
                        os.kill(frozen.pid, signal.SIGSTOP)  # mid-stream: a byte came, so no retry
                break
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert json.loads(lines[-2][len("data: ") :])["error"]["code"] == "upstream_broken"
        assert not router.app.state.router.engines[frozen_url].healthy
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        router.stop()
