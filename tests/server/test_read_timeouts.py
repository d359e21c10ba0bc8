"""Slow clients cannot hold connections: headers and bodies must arrive within their deadlines (408, closed).

Each slow client is a raw socket that trickles bytes in a loop bounded by
many times the deadline; the test asserts the server ended every one of them,
not how fast.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from serving_harness import start_server, stop_server
from slow_client import SlowClient, trickle_until_all_closed

DEADLINE_SECONDS = 1.0


@pytest.fixture(scope="module")
def strict_server(tiny_llama):
    running = start_server(tiny_llama, header_timeout_seconds=DEADLINE_SECONDS, body_timeout_seconds=DEADLINE_SECONDS)
    yield running
    stop_server(running)


def test_headers_trickled_byte_by_byte_get_408_and_the_connection_closed(strict_server):
    opening = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n"
    clients = [SlowClient(strict_server.url, opening, b"X-Slow: " + b"a" * 1000) for _ in range(20)]
    trickle_until_all_closed(clients)
    for c in clients:
        error = c.error()
        assert error["code"] == "request_timeout" and "headers" in error["message"], error
    assert httpx.get(strict_server.url + "/health").status_code == 200


def test_a_kept_alive_connection_whose_next_request_trickles_is_closed_too(strict_server):
    first = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
    client = SlowClient(strict_server.url, first, b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 1000)
    trickle_until_all_closed([client])
    assert client.received.startswith(b"HTTP/1.1 200"), client.received[:200]
    second = client.received[client.received.index(b"HTTP/1.1", 1) :]
    assert second.startswith(b"HTTP/1.1 408"), second[:200]


def test_a_trickled_body_gets_408_and_the_connection_closed(strict_server):
    body = json.dumps({"model": "tiny", "prompt": "hello " * 100, "max_tokens": 2}).encode()
    opening = (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10]
    )
    clients = [SlowClient(strict_server.url, opening, body[10:]) for _ in range(10)]
    trickle_until_all_closed(clients)
    for c in clients:
        error = c.error()
        assert error["code"] == "request_timeout" and "body" in error["message"], error
    metrics = strict_server.wait_idle()
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0


def test_the_unread_rest_of_a_body_trickled_after_the_response_does_not_hold_the_connection(strict_server):
    """GET /health answers without reading the declared body; each byte of its rest cancelled keep-alive."""
    opening = b"GET /health HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n"
    clients = [SlowClient(strict_server.url, opening, b"a" * 100000) for _ in range(5)]
    trickle_until_all_closed(clients)
    for c in clients:
        assert c.received.startswith(b"HTTP/1.1 200"), c.received[:200]
    assert httpx.get(strict_server.url + "/health").status_code == 200


def test_requests_sent_at_once_are_unaffected(strict_server):
    with httpx.Client(base_url=strict_server.url, timeout=30) as client:
        for _ in range(3):  # one kept-alive connection, longer in all than the deadline
            r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
            assert r.status_code == 200, r.text
            time.sleep(DEADLINE_SECONDS / 2)
