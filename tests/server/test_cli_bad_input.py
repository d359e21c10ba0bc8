"""Bad flags of `pagedinfer serve` / `bench serve`: one clear line naming the flag, exit status 2, no traceback."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pagedinfer.contracts.config import cli_types

CLI = Path(sys.executable).with_name("pagedinfer")

# (id, arguments, the flag the error must name)
BAD_INVOCATIONS = [
    ("serve-port-too-large", ["serve", "--port", "70000"], "--port"),
    ("serve-port-zero", ["serve", "--port", "0"], "--port"),
    ("serve-port-not-a-number", ["serve", "--port", "http"], "--port"),
    ("serve-zero-waiting-limit", ["serve", "--max-waiting-requests", "0"], "--max-waiting-requests"),
    ("serve-negative-body-limit", ["serve", "--max-request-body-bytes", "-1"], "--max-request-body-bytes"),
    ("serve-negative-grace", ["serve", "--shutdown-grace-seconds", "-1"], "--shutdown-grace-seconds"),
    ("serve-nan-grace", ["serve", "--shutdown-grace-seconds", "nan"], "--shutdown-grace-seconds"),
    (
        "serve-zero-header-timeout",
        ["serve", "--request-header-timeout-seconds", "0"],
        "--request-header-timeout-seconds",
    ),
    (
        "serve-infinite-body-timeout",
        ["serve", "--request-body-timeout-seconds", "inf"],
        "--request-body-timeout-seconds",
    ),
    ("bench-nothing-listening", ["bench", "serve", "--url", "http://127.0.0.1:1", "--no-progress"], "--url"),
    ("bench-not-a-url", ["bench", "serve", "--url", "notaurl", "--no-progress"], "--url"),
    ("bench-url-bad-port", ["bench", "serve", "--url", "http://127.0.0.1:99999", "--no-progress"], "--url"),
    ("bench-zero-concurrency", ["bench", "serve", "--max-concurrency", "0"], "--max-concurrency"),
    # Flags only as spelled out: a prefix would get past the operator's check of extraArgs.
    ("serve-abbreviated-api-key", ["serve", "--api-k", "not-a-key"], "--api-k"),
    ("serve-abbreviated-flag-with-value", ["serve", "--num-gpu-blocks=999999"], "--num-gpu-blocks"),
]


@pytest.mark.parametrize("argv, flag", [c[1:] for c in BAD_INVOCATIONS], ids=[c[0] for c in BAD_INVOCATIONS])
def test_bad_flag_exits_2_naming_it_without_a_traceback(argv, flag):
    """Each fails at argument parsing or at the first connection: no model is loaded (timeout 60 s)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PAGEDINFER_API_KEY", None)
    proc = subprocess.run([str(CLI), *argv], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    last_line = proc.stderr.strip().splitlines()[-1]
    assert flag in last_line and "error" in last_line, proc.stderr


def test_serve_on_a_port_in_use_exits_2_naming_it_before_loading_the_model(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PAGEDINFER_API_KEY", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [str(CLI), "serve", "--port", str(port), "--device", "cpu", "--log-level", "debug"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last_line = proc.stderr.strip().splitlines()[-1]
    assert "--port" in last_line and str(port) in last_line and "in use" in last_line, proc.stderr[-2000:]
    assert "engine ready" not in proc.stderr and "Loading" not in proc.stderr  # the model was never loaded
    assert f"http://127.0.0.1:{port}" not in proc.stderr  # nor the address announced as if served


def test_a_port_another_server_has_bound_is_refused_before_it_listens():
    """SO_REUSEADDR let a second socket bind a port whose first socket was bound but not yet listening."""
    from pagedinfer.engine.server.launcher import bind_listener

    first = bind_listener("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError, match="--port"):
            bind_listener("127.0.0.1", first.getsockname()[1]).close()
    finally:
        first.close()


def test_no_parser_takes_an_abbreviated_flag():
    from pagedinfer.engine.cli import build_parser

    def walk(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)

    parsers = list(walk(build_parser()))
    assert {p.prog for p in parsers} >= {"pagedinfer serve", "pagedinfer bench serve", "pagedinfer generate"}
    assert all(p.allow_abbrev is False for p in parsers), [p.prog for p in parsers if p.allow_abbrev]
    for argv in (
        ["serve", "--served=other"],
        ["bench", "serve", "--ur", "http://127.0.0.1:1"],
        ["generate", "--max-tok", "3"],
        ["plan", "--mod", "m", "--gpu-memory", "1G"],
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
    assert build_parser().parse_args(["serve", "--api-key=k"]).api_key == "k"


def test_serve_limits_the_waiting_queue_by_default():
    from pagedinfer.engine.cli import build_parser
    from pagedinfer.engine.server.app import ServerSettings

    assert build_parser().parse_args(["serve"]).max_waiting_requests == 1024
    assert ServerSettings().max_waiting_requests == 1024


@pytest.mark.parametrize("text, expected", [("1", 1), ("8000", 8000), ("65535", 65535)])
def test_port_accepts_1_to_65535(text, expected):
    assert cli_types.port(text) == expected


@pytest.mark.parametrize("text", ["0", "65536", "-80", "8000.5", ""])
def test_port_refuses_everything_else(text):
    with pytest.raises(argparse.ArgumentTypeError):
        cli_types.port(text)


def test_seconds_may_be_zero_but_not_negative_or_infinite():
    assert cli_types.non_negative_seconds("0") == 0.0
    assert cli_types.non_negative_seconds("2.5") == 2.5
    for text in ("-0.1", "inf", "nan", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli_types.non_negative_seconds(text)


def test_timeouts_must_be_positive_and_the_error_says_so():
    assert cli_types.positive_seconds("0.5") == 0.5
    for text in ("0", "-1", "inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="> 0"):  # not ">= 0": 0 is refused too
            cli_types.positive_seconds(text)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("https://llm.example:443/api", "https://llm.example:443/api"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_url_keeps_http_base_urls(text, expected):
    assert cli_types.http_url(text) == expected


@pytest.mark.parametrize(
    "text", ["notaurl", "127.0.0.1:8000", "ftp://host", "http://", "http://h:99999", "http://h/v1?x=1"]
)
def test_url_refuses_what_httpx_cannot_use(text):
    with pytest.raises(argparse.ArgumentTypeError):
        cli_types.http_url(text)
