"""Putting standby engines to sleep (the I/O of the idle rule's standby, autoscaling.idle).

`POST /sleep` on an engine releases its KV pool and moves its weights to
host memory; the router wakes it (`POST /wake_up`) when a request comes.
Every call is bounded by a timeout; a failure is logged and returned, never
raised: the next round of an idle service finds the engine still awake and
asks again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

logger = logging.getLogger(__name__)

SLEEP_PATH = "/sleep"


@dataclass(frozen=True)
class EngineTarget:
    """A ready engine pod and its server's base URL (http://<podIP>:<port>)."""

    name: str
    base_url: str


async def put_to_sleep(
    session: aiohttp.ClientSession, engines: Sequence[EngineTarget], timeout_seconds: float
) -> list[str]:
    """POST /sleep to each engine at once; returns the names of those that did not answer 2xx in time."""

    async def one(engine: EngineTarget) -> str | None:
        try:
            async with asyncio.timeout(timeout_seconds):
                async with session.post(engine.base_url + SLEEP_PATH, allow_redirects=False) as response:
                    if response.status // 100 == 2:
                        return None
                    why = f"HTTP {response.status}: {(await response.text())[:200]}"
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            why = "timed out" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
        logger.warning("cannot put engine %s to sleep (POST %s%s): %s", engine.name, engine.base_url, SLEEP_PATH, why)
        return engine.name

    failed = await asyncio.gather(*(one(e) for e in engines))
    return [name for name in failed if name is not None]
