"""uvicorn's h11 protocol with a deadline on a request's headers (`--request-header-timeout-seconds`).

uvicorn bounds the idle time between requests on a kept-alive connection
(`timeout_keep_alive`) and h11 bounds the headers' size
(`h11_max_incomplete_event_size`, 16 KiB), but nothing bounds the time a
client takes to send them: a connection that trickles one header byte every
few seconds is held forever, and a few hundred of them hold the server's
connections and memory (slowloris). The body has its own deadline, enforced
in `body_limit.py`, since by then the ASGI app is running.

The deadline starts when the connection opens and again when the first bytes
of a later request on it arrive, and ends when h11 has parsed the request
line and headers (the client's state leaves IDLE). If it passes first, the
client gets a 408 in OpenAI's error shape with `Connection: close` (written
raw: h11 only sends a response to a request it has parsed) and the connection
is closed.

One more read has no deadline in uvicorn: the rest of a body nobody read
(a GET /health with a Content-Length, a 401 or 404 sent before the body).
Once the response is complete uvicorn discards that rest to keep the
connection, and each byte of it cancels the keep-alive timer, so one byte now
and then held the connection forever. Here the rest must arrive within the
same deadline, counted from its first byte after the response; if it does
not, the connection is closed (the response was already sent).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from pagedinfer.contracts import validators


def request_timeout_bytes(message: str) -> bytes:
    """A complete HTTP/1.1 408 response whose body is OpenAI's error shape."""
    from pagedinfer.contracts.http.errors import error_body

    body = json.dumps(error_body(408, message, code="request_timeout"), separators=(",", ":")).encode("ascii")
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\n\r\n"
    )
    return head + body


def header_timeout_protocol(header_timeout_seconds: float) -> type[asyncio.Protocol]:
    """An H11Protocol class (uvicorn's `http=` setting) whose requests must send headers within the deadline."""
    validators.positive_seconds("header_timeout_seconds", header_timeout_seconds)
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    refusal = request_timeout_bytes(f"request headers: not received within {header_timeout_seconds:g} seconds")

    class HeaderTimeoutH11Protocol(H11Protocol):
        _header_deadline: asyncio.TimerHandle | None = None
        _discard_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._keep_deadline("_header_deadline", True, self._header_deadline_passed)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            closing = self.transport.is_closing()
            # headers awaited: the first request's, or a later one's on a kept-alive connection once it began
            self._keep_deadline(
                "_header_deadline", self.conn.their_state is h11.IDLE and not closing, self._header_deadline_passed
            )
            self._keep_deadline(
                "_discard_deadline", self._discarding_body() and not closing, self._discard_deadline_passed
            )

        def connection_lost(self, exc: Exception | None) -> None:
            self._keep_deadline("_header_deadline", False, self._header_deadline_passed)
            self._keep_deadline("_discard_deadline", False, self._discard_deadline_passed)
            super().connection_lost(exc)

        def _keep_deadline(self, attr: str, wanted: bool, on_expiry: Callable[[], None]) -> None:
            """Arm the deadline `attr` if wanted and not armed (an armed one keeps its start); else cancel it."""
            handle = getattr(self, attr)
            if wanted and handle is None:
                setattr(self, attr, self.loop.call_later(header_timeout_seconds, on_expiry))
            elif not wanted and handle is not None:
                handle.cancel()
                setattr(self, attr, None)

        def _discarding_body(self) -> bool:
            """The response is complete and the client is still sending a body nobody reads."""
            return self.conn.our_state is h11.DONE and self.conn.their_state is h11.SEND_BODY

        def _discard_deadline_passed(self) -> None:
            self._discard_deadline = None
            if self._discarding_body() and not self.transport.is_closing():
                self.transport.close()

        def _header_deadline_passed(self) -> None:
            self._header_deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            self.transport.write(refusal)
            self.transport.close()

    return HeaderTimeoutH11Protocol
