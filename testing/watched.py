"""What a wait depends on: the processes and tasks whose unexpected end fails `eventually` at once.

Why: `eventually` polls a condition until its timeout. When what would make the condition true has
already died (a pod's engine exited at start, the operator's task raised), the wait can only time
out, long after the cause, and says nothing of it: a tensor-parallel end-to-end test spent 240 s
waiting for the URL of a pod whose engine had exited in its first seconds.

What: a harness registers what it runs for as long as it runs it (`with watching(...)`), and
`eventually` calls `raise_if_died()` before each poll. The first registered thing that has ended
unexpectedly raises `Died`, which names it and says why: a process's exit code (or signal) and the
last `LOG_TAIL_LINES` lines of its log, a task's exception and the tail of its traceback.

Invariants:
- Scope. The registry is a ContextVar, not a module global: a registration holds in the task that
  made it, and in the tasks that task creates inside the block, until its `with` block ends. It
  never reaches another test (each test runs in its own task) or code outside the block. A ContextVar
  rather than an argument of `eventually`: the harness knows what it runs, the hundreds of waits in
  the tests need not name it.
- Only unexpected ends count. Everything registered is something the block relies on and that
  nothing restarts, so its end dooms (or falsifies) every wait in the block; but an end that was
  asked for is not a failure. A watch reports a death only if nobody asked the thing to stop first:
  the operator's stop flag set, a pod's process stopped by the kubelet harness (scale-down,
  teardown) or by a test that deleted the pod's Pod object, `ProcessWatch.stopping` set by whoever
  stops a process on purpose.
- `death()` is cheap and changes nothing that matters: it runs at every poll (every 50 ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import signal
import subprocess
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

LOG_TAIL_LINES = 30
_TAIL_BYTES = 64 * 1024  # read no more than this of a log's end: 30 lines of an engine's log fit easily

_WATCHED: contextvars.ContextVar[tuple[Watch, ...]] = contextvars.ContextVar("pagedinfer_watched", default=())


class Watch(Protocol):
    def death(self) -> str | None:
        """None while the thing runs, or once it was stopped on purpose; else what ended and why."""


class Died(AssertionError):
    """A process or task that a wait depends on ended unexpectedly; the message names it and says why."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of the file at `path` (its last 64 KiB at most), or why it cannot be read."""
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            size = log.tell()
            log.seek(max(0, size - _TAIL_BYTES))
            text = log.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(log empty)"


def exit_report(name: str, returncode: int, log_path: Path | None = None, when: str = "") -> str:
    """'<name> exited with code N<when>' (or 'was killed by SIGx<when>'), then its log's tail when it has one."""
    if returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with code {returncode}"
    how += when
    if log_path is None:
        return f"{name} {how}"
    return f"{name} {how}; the last {LOG_TAIL_LINES} lines of its log {log_path}:\n{log_tail(log_path)}"


def returncode(process: subprocess.Popen | asyncio.subprocess.Process) -> int | None:
    """The exit status of a `subprocess.Popen` (reaped here) or of an asyncio subprocess; None while it runs."""
    return process.poll() if isinstance(process, subprocess.Popen) else process.returncode


@dataclass
class ProcessWatch:
    """A child process the block relies on. Set `stopping` before stopping it on purpose."""

    name: str  # says which process, for the failure's message: "the router pod tiny-router-1"
    process: subprocess.Popen | asyncio.subprocess.Process
    log_path: Path | None = None  # where its stdout and stderr go
    stopping: bool = False

    def death(self) -> str | None:
        code = None if self.stopping else returncode(self.process)
        return None if code is None else exit_report(self.name, code, self.log_path)


@dataclass
class TaskWatch:
    """An asyncio task the block relies on; `stopping()` is true once it was asked to stop (its stop flag)."""

    name: str
    task: asyncio.Task
    stopping: Callable[[], bool] = lambda: False

    def death(self) -> str | None:
        if not self.task.done() or self.stopping():
            return None
        if self.task.cancelled():
            return f"{self.name} was cancelled"
        error = self.task.exception()
        if error is None:
            return f"{self.name} returned before it was asked to stop"
        lines = "".join(traceback.format_exception(error)).rstrip().splitlines()
        return f"{self.name} raised {error!r}; the end of its traceback:\n" + "\n".join(lines[-LOG_TAIL_LINES:])


@contextlib.contextmanager
def watching(*watches: Watch) -> Iterator[None]:
    """Register `watches` for the block (see the module docstring for the scope)."""
    _WATCHED.set(_WATCHED.get() + watches)
    try:
        yield
    finally:
        # By identity rather than with a ContextVar token: a token cannot be used from another context
        # (an async fixture's teardown may run in one), and blocks may end out of order.
        _WATCHED.set(tuple(w for w in _WATCHED.get() if not any(w is mine for mine in watches)))


def raise_if_died() -> None:
    """Raise `Died` for the first registered watch that ended unexpectedly; else return."""
    for watch in _WATCHED.get():
        reason = watch.death()
        if reason is not None:
            raise Died(reason)


async def stop_task(task: asyncio.Task, grace_seconds: float, cancel_seconds: float = 10.0) -> None:
    """Let `task` (already asked to stop) end within `grace_seconds`; then cancel it and wait `cancel_seconds`.

    Bounded, unlike `asyncio.wait_for`, which waits for a cancelled task to end however long that takes:
    a task still running after both raises TimeoutError naming it. The task's own exception, if it
    raised one, is left to the caller (`task.exception()`)."""
    await asyncio.wait({task}, timeout=grace_seconds)
    if task.done():
        return
    task.cancel()
    await asyncio.wait({task}, timeout=cancel_seconds)
    if not task.done():
        raise TimeoutError(
            f"task {task.get_name()!r} still running {grace_seconds:g} s after it was asked to stop "
            f"and {cancel_seconds:g} s after it was cancelled"
        )
