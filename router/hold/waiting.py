"""One held request's wait, as HTTP sees it: until an engine is ready, its deadline, or its client leaves.

A streamed request (`stream: true`) that has waited `keepalive_seconds`
gets its answer's headers (200, text/event-stream) and then an SSE comment
line, `: keep-alive`, every `keepalive_seconds` while it waits on: comment
lines are ignored by SSE parsers (the `openai` client's included), and they
keep proxies and clients from timing an idle connection out. Once its
headers are sent a held stream can no longer become a 503: its timeout is an
error event (the OpenAI error body, code `no_engine`) and `data: [DONE]`,
which the `openai` client raises as an `APIError` with that message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from pagedinfer.contracts.http.disconnect import watch_disconnect
from pagedinfer.router.hold.queue import HoldQueue, Ticket

READY, EXPIRED, GONE, KEEPALIVE, CLOSED = "ready", "expired", "gone", "keepalive", "closed"
KEEPALIVE_LINE = b": keep-alive\n\n"


async def wait_for_engine(
    queue: HoldQueue,
    ticket: Ticket,
    ready: Callable[[], bool],
    request: Request | None,
    at_most_seconds: float | None = None,
) -> str:
    """READY once `ready()`; EXPIRED at the ticket's deadline; KEEPALIVE after `at_most_seconds`; GONE when the
    client disconnects (watched only with `request`: a response already streaming is cancelled instead); CLOSED
    once the queue is closed (the router is stopping)."""
    watcher = asyncio.ensure_future(watch_disconnect(request)) if request is not None else None
    try:
        while not ready():
            if queue.closed:
                return CLOSED
            if queue.expired(ticket):
                return EXPIRED
            waiter = asyncio.ensure_future(queue.wait(ticket, at_most_seconds))
            done, _ = await asyncio.wait(
                {waiter} if watcher is None else {waiter, watcher}, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter not in done:
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)
                return GONE
            if not waiter.result():
                return EXPIRED if queue.expired(ticket) else KEEPALIVE
        return READY
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)


def sse(payload: Any) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


async def as_stream_body(response: Response) -> AsyncIterator[bytes]:
    """An engine's answer, inside a held stream whose 200 headers are already sent: a stream's bytes as they
    come; anything else (an error JSON) as one event, then [DONE]."""
    if isinstance(response, StreamingResponse):
        body = response.body_iterator
        try:
            async for chunk in body:
                yield chunk if isinstance(chunk, bytes) else chunk.encode()
        finally:
            await body.aclose()  # its `finally` frees the engine's in-flight count however the client leaves
        return
    try:
        payload = json.loads(response.body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or "error" not in payload:
        payload = {
            "error": {
                "message": f"the engine answered {response.status_code}",
                "type": "server_error",
                "param": None,
                "code": "upstream_broken",
            }
        }
    yield sse(payload) + sse("[DONE]")


async def held_stream(
    first: Callable[[], Awaitable[Any]], expired: Callable[[str], bytes], leave: Callable[[], None]
) -> AsyncIterator[bytes]:
    """The body of a stream committed while held: keep-alives while `first()` says KEEPALIVE, then the
    engine's answer (a Response) or, at its deadline or the router's stop, the `expired(outcome)` event.
    `leave()` runs however it ends."""
    try:
        while True:
            yield KEEPALIVE_LINE
            outcome = await first()
            if outcome == KEEPALIVE:
                continue
            if outcome != READY and not isinstance(outcome, Response):
                yield expired(outcome)
                return
            async for chunk in as_stream_body(outcome):
                yield chunk
            return
    finally:
        leave()
