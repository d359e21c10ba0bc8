"""A slow HTTP client: a raw socket that trickles bytes, bounded in time, for read-deadline tests."""

from __future__ import annotations

import json
import socket
import time


class SlowClient:
    """A socket that sends `opening`, then one byte of `trickle` per round, collecting whatever comes back."""

    def __init__(self, url: str, opening: bytes, trickle: bytes) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.sendall(opening)
        self.sock.setblocking(False)
        self.trickle = trickle
        self.received = b""
        self.closed = False

    def round(self) -> None:
        """Read what arrived; send the next byte unless the server has closed the connection."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    self.closed = True
                    return
                self.received += data
        except BlockingIOError:
            pass
        except ConnectionError:
            self.closed = True
            return
        try:
            self.sock.send(self.trickle[:1] or b"x")
            self.trickle = self.trickle[1:]
        except (BlockingIOError, ConnectionError):
            pass

    def error(self) -> dict:
        head, _, body = self.received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), self.received[:300]
        assert b"connection: close" in head.lower()
        return json.loads(body)["error"]


def trickle_until_all_closed(
    clients: list[SlowClient], loop_bound_seconds: float = 20.0, interval_seconds: float = 0.2
) -> None:
    """Trickle every client until the server closed each; fail if any is open after the bound."""
    end = time.monotonic() + loop_bound_seconds
    try:
        while not all(c.closed for c in clients) and time.monotonic() < end:
            for c in clients:
                if not c.closed:
                    c.round()
            time.sleep(interval_seconds)
        open_ones = sum(not c.closed for c in clients)
        assert open_ones == 0, f"{open_ones} of {len(clients)} slow connections still open"
    finally:
        for c in clients:
            c.sock.close()
