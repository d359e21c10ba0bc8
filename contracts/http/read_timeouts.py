"""Deadlines on reading a request: their defaults and their two flags, shared by `serve` and `router`.

Importing this module imports neither uvicorn nor FastAPI (the operator derives the engine's flags from
`ServeArgs`, which adds these). The headers' deadline is enforced by `header_timeout.py` (uvicorn's h11
protocol), the body's by `body_limit.py`, since by then the ASGI app is running.
"""

from __future__ import annotations

from typing import Any

from pagedinfer.contracts.config import cli_types

DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0  # the request line and headers, from the connection or the request's first byte
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0  # the whole body, from the end of the headers (1 MiB at 35 KB/s)


def add_read_timeout_args(group: Any) -> None:
    """The two client read deadlines as flags, one definition for `serve` and `router`."""
    group.add_argument(
        "--request-header-timeout-seconds",
        type=cli_types.positive_seconds,
        default=DEFAULT_HEADER_TIMEOUT_SECONDS,
        help="a request's line and headers must arrive within this many seconds of the connection"
        " opening (or of the request's first byte on a kept-alive connection), else 408 and"
        f" close (default {DEFAULT_HEADER_TIMEOUT_SECONDS:g})",
    )
    group.add_argument(
        "--request-body-timeout-seconds",
        type=cli_types.positive_seconds,
        default=DEFAULT_BODY_TIMEOUT_SECONDS,
        help="a request's whole body must arrive within this many seconds of its headers, else 408"
        f" and close (default {DEFAULT_BODY_TIMEOUT_SECONDS:g})",
    )
