"""argparse `type=` checks for the server's flags, so bad values stop at parsing with a named error.

Each function takes the flag's text and returns the value or raises
`argparse.ArgumentTypeError`; argparse then prints
`pagedinfer serve: error: argument --port: ...` and exits 2, before the
model is loaded. Pure: no I/O.
"""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from pagedinfer.contracts import validators

MAX_PORT = 65535


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def port(text: str) -> int:
    """A TCP port to listen on, 1-65535."""
    value = _int(text)
    if not 1 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to {MAX_PORT}, got {value}")
    return value


def port_or_zero(text: str) -> int:
    """A TCP port 1-65534 (the one above it is used too), or 0 for any free port."""
    value = _int(text)
    if not 0 <= value <= MAX_PORT - 1:
        raise argparse.ArgumentTypeError(f"must be 0 (any free port) or a port from 1 to {MAX_PORT - 1}, got {value}")
    return value


def _bounded_int(text: str, minimum: int) -> int:
    value = _int(text)
    problem = validators.int_problem(value, minimum)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{problem}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return _bounded_int(text, 0)


def positive_int(text: str) -> int:
    return _bounded_int(text, 1)


def _seconds(text: str, allow_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    problem = validators.seconds_problem(value, allow_zero)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
    return value


def non_negative_seconds(text: str) -> float:
    """A finite number of seconds >= 0 (0 means at once)."""
    return _seconds(text, allow_zero=True)


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    return _seconds(text, allow_zero=False)


def http_url(text: str) -> str:
    """An http(s) base URL with a host and a valid port, without a trailing slash."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"must be an http:// or https:// URL such as http://127.0.0.1:8000, got {text!r}"
        )
    try:
        _ = parts.port  # parsing the port raises for one out of range
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid port ({exc}), got {text!r}") from None
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"must be a base URL without ?query or #fragment, got {text!r}")
    return text.rstrip("/")
