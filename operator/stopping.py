"""Waiting inside a kopf daemon so that it stops at once when kopf asks (shared by the operator's daemons)."""

from __future__ import annotations

import asyncio
import time

import kopf

STOP_POLL_SECONDS = 0.2


async def sleep_unless_stopped(stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Sleep in short steps, checking the flag. (kopf's `stopped.wait(timeout)` runs a side
    task that, timing out while the operator exits, surfaces as a TimeoutError at shutdown.)"""
    deadline = time.monotonic() + seconds
    while not stopped and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, STOP_POLL_SECONDS))
