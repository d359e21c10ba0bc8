"""A client that goes away aborts its request at once, streaming or not, and its blocks come back."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time

import httpx

LONG = {"model": "tiny", "prompt": "Tell me everything", "max_tokens": 240, "ignore_eos": True, "temperature": 0}


def _aborts(server) -> float:
    return server.metrics().get('pagedinfer_request_success_total{finished_reason="abort"}', 0.0)


def _wait_running(server, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while server.metrics().get("pagedinfer_num_requests_running", 0) < 1:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.01)


def test_non_streaming_client_that_hangs_up_aborts_its_request(server):
    before = _aborts(server)
    host, port = server.url.removeprefix("http://").split(":")
    payload = json.dumps(LONG).encode()
    # The client hangs up once its request is running (an event, not a client-side timeout that a loaded
    # machine can outrun before the server has even read the request), long before 240 tokens are generated.
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )
        _wait_running(server)
    metrics = server.wait_idle()
    assert _aborts(server) == before + 1
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0
    assert metrics["pagedinfer_kv_cache_free_blocks"] == metrics["pagedinfer_kv_cache_num_blocks"]


def test_streaming_client_that_hangs_up_aborts_its_request(server):
    before = _aborts(server)
    generated_before = server.metrics()["pagedinfer_generation_tokens_total"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                _wait_running(server)
                break
    metrics = server.wait_idle()
    assert _aborts(server) == before + 1
    assert metrics["pagedinfer_generation_tokens_total"] - generated_before < LONG["max_tokens"]
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0


def _reset_after_first_events(url: str, body: dict, num_events: int = 3) -> None:
    """Send a streaming request on a raw socket, read a few events, then reset the connection (RST)."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )
        received = b""
        while received.count(b"data: ") < num_events:
            data = sock.recv(65536)
            assert data, received[-500:]
            received += data
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_reset_stream_of_many_prompts_is_not_written_to_after_it_is_gone(server, caplog):
    """asyncio logs "socket.send() raised exception." from the fifth write to a lost connection on.

    Each engine step delivers one output per prompt; written one by one, the
    40 chunks of a step all went to a connection that had just been reset.
    """
    body = {
        "model": "tiny",
        "prompt": [f"Prompt {i} goes on and on" for i in range(40)],
        "max_tokens": 60,
        "ignore_eos": True,
        "stream": True,
    }
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        for _ in range(3):
            _reset_after_first_events(server.url, body)
        metrics = server.wait_idle()
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0
    assert not [r for r in caplog.records if "socket.send()" in r.getMessage()]
