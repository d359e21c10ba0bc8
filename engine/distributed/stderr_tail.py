"""A child's stderr, passed on to ours as it comes, its last lines kept for the error that names it.

A rank that dies while importing (a broken install, a folder shadowing a package) never reaches the
replica's store: what it printed is the only account of why. `StderrTail` reads the child's stderr
pipe in a daemon thread, writes every line on to file descriptor 2 (where an inherited stderr would
have put it: the user still sees every rank's warnings and tracebacks) and keeps the last
`max_lines` lines.

Invariants:
- the reader only reads the pipe and writes fd 2, so the child never waits on rank 0's engine;
- `text(wait_seconds)` waits at most `wait_seconds` for the pipe's end (it comes once the dead
  child, and anything it started that inherited its stderr, has exited), then returns what it has.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from typing import BinaryIO


class StderrTail:
    def __init__(self, pipe: BinaryIO, name: str, max_lines: int = 12) -> None:
        self._lines: deque[bytes] = deque(maxlen=max_lines)
        self._thread = threading.Thread(target=self._pump, args=(pipe,), name=f"pagedinfer-stderr-{name}", daemon=True)
        self._thread.start()

    def _pump(self, pipe: BinaryIO) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                self._lines.append(line)
                with contextlib.suppress(OSError):  # our stderr closed: keep the tail all the same
                    _write_all(2, line)

    def text(self, wait_seconds: float) -> str:
        """The last lines the child wrote (after waiting up to `wait_seconds` for its pipe to end)."""
        self._thread.join(wait_seconds)
        return b"".join(list(self._lines)).decode(errors="replace").rstrip()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
