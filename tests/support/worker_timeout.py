"""A pytest plugin: in a pytest-xdist worker, a test past its timeout says so where the run's output shows it.

pytest-timeout's thread method writes its report (the test, its captured output, every thread's stack) to
pytest's terminal writer, which in an xdist worker is a temporary file nobody reads (execnet keeps the
worker's stdout for its channel): a hung test ended its worker with nothing but "worker 'gw0' crashed".
In a worker this plugin sets the test's timer instead (pytest-timeout's `pytest_timeout_set_timer` hook, thread
method only): past the test's timeout it writes to stderr, which the worker shares with the run, what
teardown_watchdog.expire writes (the test, its captured output, every thread's stack and every task still
pending in its event loop), then ends the worker with exit status 1, as pytest-timeout does. pytest-timeout
still cancels it (`item.cancel_timeout`). scripts/test.sh runs xdist with --max-worker-restart=0, so a worker's
end is the run's end, as a hang ends a run in one process.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from teardown_watchdog import expire


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if not hasattr(item.config, "workerinput") or settings.method != "thread":
        return None  # one process, or another method: pytest-timeout's own timer
    timer = threading.Timer(settings.timeout, expire, args=(item, settings.timeout, "test"))
    timer.name = "worker-timeout"
    timer.daemon = True
    timer.start()
    item.cancel_timeout = timer.cancel
    return True
