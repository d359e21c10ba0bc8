"""ASGI middleware that reads each request body within a byte limit (413) and a deadline (408).

A declared Content-Length over the limit is refused before anything is
read. Otherwise the body is read chunk by chunk (chunked uploads have no
length) and refused as soon as the running total passes the limit, so a
client can never make the server buffer more than `max_body_bytes`. The
whole body must arrive within `body_timeout_seconds` of the request's
headers; a client that trickles it gets a 408 with `Connection: close`
(uvicorn then closes the connection), so slow uploads cannot pile up
buffers. An accepted body is replayed to the application; later `receive()`
calls go to the real channel, so disconnect detection keeps working.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pagedinfer.contracts import validators
from pagedinfer.contracts.http.errors import error_response

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodySizeLimitMiddleware:
    def __init__(self, app: Callable, max_body_bytes: int, body_timeout_seconds: float) -> None:
        validators.positive_int("max_body_bytes", max_body_bytes)
        validators.positive_seconds("body_timeout_seconds", body_timeout_seconds)
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_seconds = body_timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        num_bytes = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_seconds
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                await self._time_out(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            num_bytes += len(chunk)
            if num_bytes > self.max_body_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _time_out(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            408,
            f"request body: not received within {self.body_timeout_seconds:g} seconds",
            code="request_timeout",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            f"request body is larger than the limit of {self.max_body_bytes} bytes",
            code="request_too_large",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)
