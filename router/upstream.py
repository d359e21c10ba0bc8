"""Waiting on an engine: the bounds on its answer, and giving up on an engine that is lost.

Two bounds, one per phase of an answer:
- the first byte: the engine's status line and headers of a *streamed*
  request must arrive within `first_byte_timeout_seconds` of sending it. An
  engine sends a stream's headers once it has admitted the request (before
  the prompt's prefill), so a healthy engine answers in well under a second
  even at load (docs/router.md, "Faults", has the measurement). A
  non-streamed request's first byte is its whole answer, so bounding it
  would bound generation length: it has no first-byte bound;
- between chunks: `UPSTREAM_READ_TIMEOUT_SECONDS`, each read of the body.

An engine is lost when its health check fails or a connection to it is
refused (`RouterState.mark_dead`, which sets the engine's `lost` event). Every
wait on an engine is raced against that event, so a request in flight to a
frozen engine is given up within a health check (about 2.5 s), never after
the read timeout.

Invariant: a request is tried again on another engine only while nothing of
the engine's answer was received (no status line): once a byte has arrived
the engine ran the request, and a retry would run it twice. After that, a
lost engine ends a stream with the `upstream_broken` error event and [DONE],
and a non-streamed request with a 502 `upstream_broken`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

# No httpx here: `pagedinfer router`'s parser reads the defaults where the router's extra is not installed.
DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS = 10.0  # a stream's headers: measured at most 0.12 s at load (docs/router.md)
UPSTREAM_READ_TIMEOUT_SECONDS = 300.0  # each read after the headers: between a stream's chunks
UPSTREAM_CONNECT_TIMEOUT_SECONDS = 5.0
UPSTREAM_WRITE_TIMEOUT_SECONDS = 30.0
UPSTREAM_POOL_TIMEOUT_SECONDS = 10.0

T = TypeVar("T")


class EngineLost(Exception):
    """The engine was marked dead, or missed the first-byte bound, while this request waited on it."""


async def unless_lost(
    awaitable: Awaitable[T], lost: asyncio.Event, timeout_seconds: float | None = None, what: str = "answer"
) -> T:
    """The awaitable's result; EngineLost if `lost` is set or `timeout_seconds` pass first (it is cancelled).

    A result that arrives as it is cancelled is closed if it is a response,
    so no connection is leaked.
    """
    task = asyncio.ensure_future(awaitable)
    waiter = asyncio.ensure_future(lost.wait())
    try:
        done, _ = await asyncio.wait({task, waiter}, timeout=timeout_seconds, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        await _settle(task)
        raise
    finally:
        waiter.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await _settle(task)
    if lost.is_set():
        raise EngineLost(f"the engine was dropped before its {what}")
    raise EngineLost(f"no {what} within {timeout_seconds:g} s")


async def _settle(task: asyncio.Future) -> None:
    """Wait for a cancelled task to end (a cancel of our own caller still propagates); close its response."""
    (result,) = await asyncio.gather(task, return_exceptions=True)
    if not isinstance(result, BaseException) and hasattr(result, "aclose"):  # an httpx.Response
        await result.aclose()
