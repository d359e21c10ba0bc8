"""The `pagedinfer router` process holds no slow client: headers and bodies have deadlines, as `serve`."""

from __future__ import annotations

from router_harness import start_router_process
from slow_client import SlowClient, trickle_until_all_closed

from pagedinfer.testing.server_process import free_port

DEADLINE_SECONDS = 1.0


def test_the_router_process_closes_trickled_headers_and_bodies_with_408(tiny_llama, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_router_process(
        url,
        [
            "--engine",
            f"http://127.0.0.1:{free_port()}",
            "--tokenizer",
            str(tiny_llama),
            "--port",
            str(port),
            "--request-header-timeout-seconds",
            str(DEADLINE_SECONDS),
            "--request-body-timeout-seconds",
            str(DEADLINE_SECONDS),
            "--log-level",
            "warning",
        ],
        tmp_path / "router.log",
    )
    try:
        slow_headers = [
            SlowClient(url, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\n", b"X-Slow: " + b"a" * 1000)
            for _ in range(5)
        ]
        body = b'{"model": "tiny", "prompt": "' + b"hello " * 100 + b'"}'
        slow_bodies = [
            SlowClient(
                url,
                b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10],
                body[10:],
            )
            for _ in range(5)
        ]
        trickle_until_all_closed(slow_headers + slow_bodies)
        assert all(c.error()["code"] == "request_timeout" for c in slow_headers + slow_bodies)
    finally:
        proc.terminate()
        proc.wait(30)
