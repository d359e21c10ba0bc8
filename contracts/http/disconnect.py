"""A client's disconnect, watched while a non-streaming answer is made or a request waits (engine, router).

The body was already read, so `receive()` only reports the disconnect; cancelling the watcher once the
answer is ready stops it.
"""

from __future__ import annotations

from fastapi import Request


async def watch_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body was already read, so receive() only reports that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
