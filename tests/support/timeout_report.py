"""A pytest plugin: a test past its timeout is reported by name, with its stacks, where the run's output shows it.

pytest-timeout's thread method writes its report (its captured output, every thread's stack; not the test's
name, which -q never printed) to pytest's terminal writer, which in a pytest-xdist worker is a temporary file
nobody reads (execnet keeps the worker's stdout for its channel): a hung test ended its worker with nothing
but "worker 'gw0' crashed". This plugin sets the test's timer instead (pytest-timeout's
`pytest_timeout_set_timer` hook, thread method only): past the test's timeout it writes to stderr, which a
worker shares with the run, what teardown_watchdog.expire writes (the test's name, its captured output, every
thread's stack and every task still pending in its event loop), then ends the process with exit status 1, as
pytest-timeout does. pytest-timeout still cancels it (`item.cancel_timeout`). scripts/test.sh runs xdist with
--max-worker-restart=0, so a worker's end is the run's end, as a hang ends a run in one process.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pytest_timeout import is_debugging
from teardown_watchdog import expire


def _expire(item: pytest.Item, settings: Any) -> None:
    if settings.disable_debugger_detection or not is_debugging():  # as pytest-timeout: never under a debugger
        expire(item, settings.timeout, "test")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "thread":
        return None  # the signal method raises in the test: pytest reports it by name
    timer = threading.Timer(settings.timeout, _expire, args=(item, settings))
    timer.name = "test-timeout"
    timer.daemon = True
    timer.start()
    item.cancel_timeout = timer.cancel
    return True
