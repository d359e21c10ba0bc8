"""A pytest plugin: every test's teardown is bounded, a failed test's too (tests/conftest.py takes its hooks).

Why: pytest-timeout stops its timer as soon as a failure is reported (its pytest_exception_interact
hook, so that a debugger is never interrupted), so the teardown of a FAILED test ran unbounded. An
async test's event loop is closed in that teardown (pytest-asyncio's Runner), and asyncio's
_cancel_all_tasks waits for every task left in the loop: one task that ignores cancellation (a
`try/except CancelledError` loop, a condition's re-acquire) held CI until its 90-minute limit.

What: a watchdog thread armed for each teardown with the test's own timeout (its timeout marker, else
the `timeout` ini value; 0 disables it). Past it, the watchdog writes the stack of every thread and
of every task still pending in the main thread's event loop (naming the task that never finishes),
then ends the process with exit status 1, as pytest-timeout's thread method does. A run that hangs in
teardown therefore fails within the test's timeout instead.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

DEFAULT_TIMEOUT_SECONDS = 300.0
FAILURES: dict[str, str] = {}  # node id -> the failure report's text, while its teardown runs


def teardown_timeout_seconds(item: pytest.Item) -> float:
    """The item's pytest-timeout limit: its closest timeout marker, else the ini value, else 300 s."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    try:
        ini = item.config.getini("timeout")
    except ValueError:  # pytest-timeout not installed
        ini = None
    return float(ini) if ini not in (None, "") else DEFAULT_TIMEOUT_SECONDS


def main_thread_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop the main thread is running now (the `self` of a loop method on its stack)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, asyncio.AbstractEventLoop):
            return candidate
        frame = frame.f_back
    return None


def write_stacks(write: Any) -> None:
    """Every thread's stack, then every pending task of the main thread's loop (with its stack)."""
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        name = next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))
        write(f"--- thread {name}\n{''.join(traceback.format_stack(frame))}")
    loop = main_thread_loop()
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()] if loop is not None else []
    for task in tasks:
        stack = io.StringIO()
        task.print_stack(file=stack)
        write(f"--- pending task {task!r}\n{stack.getvalue()}")


def expire(item: pytest.Item, limit_seconds: float, what: str = "teardown of") -> None:
    """Print why (`what` the item was doing), the captured output and the stacks; end the process (status 1)."""
    capman = item.config.pluginmanager.getplugin("capturemanager")
    captured = ("", "")
    if capman is not None:
        capman.suspend_global_capture(item)
        captured = capman.read_global_capture()
    write = sys.stderr.write
    write(
        f"\n+++ {what} {item.nodeid} still running after {limit_seconds:g} s (its timeout): "
        f"stacks follow, then exit 1 +++\n"
    )
    failure = FAILURES.get(item.nodeid)
    if failure is not None:
        write(f"~~~ the test failed first:\n{failure}\n")
    for title, text in zip(("stdout", "stderr"), captured):
        if text:
            write(f"~~~ captured {title}\n{text}\n")
    write_stacks(write)
    sys.stderr.flush()
    os._exit(1)


@pytest.hookimpl
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep a failure's text: the process may end in its teardown, before pytest's summary."""
    if report.failed and report.when in ("setup", "call"):
        FAILURES[report.nodeid] = report.longreprtext


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    limit_seconds = teardown_timeout_seconds(item)
    timer = None
    if limit_seconds > 0:
        timer = threading.Timer(limit_seconds, expire, args=(item, limit_seconds))
        timer.name = "teardown-watchdog"
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        FAILURES.pop(item.nodeid, None)
