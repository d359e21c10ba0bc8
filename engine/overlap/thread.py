"""The output thread: runs one step's `OutputBatch` while the engine thread runs the next forward.

Invariants:
- at most one batch is in flight (`submit` refuses a second before `wait`
  took the first's result): the output side is never more than one step
  behind, and the queue between the threads is bounded by construction;
- every wait is bounded: `wait` polls in slices of `POLL_SECONDS` and raises
  if the thread has died or `timeout_seconds` passed, never hangs;
- an exception raised while processing a batch is re-raised by `wait` on
  the engine thread, which fails as any engine error does (LLM.generate
  raises, the server's engine loop fails its requests and its health check);
- `shutdown` ends the thread (a sentinel, then a bounded join); idempotent.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

POLL_SECONDS = 0.5
_STOP = object()


class OutputThreadError(RuntimeError):
    """The output thread died or did not answer in time."""


class OutputThread:
    def __init__(self, process: Callable[[Any], Any], timeout_seconds: float = 600.0) -> None:
        self._process = process
        self._timeout_seconds = timeout_seconds
        self._inbox: queue.Queue = queue.Queue(maxsize=1)
        self._results: queue.Queue = queue.Queue(maxsize=1)
        self._in_flight = False
        self.num_batches = 0  # batches processed (on this thread)
        self._thread = threading.Thread(target=self._run, name="pagedinfer-output", daemon=True)
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        """A batch was submitted and its result not yet taken by `wait`."""
        return self._in_flight

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def submit(self, batch: Any) -> None:
        """Hand a batch to the thread (returns at once)."""
        if self._in_flight:
            raise RuntimeError("output thread: a batch is already in flight; wait() for it first")
        if not self._thread.is_alive():
            raise OutputThreadError("output thread: not running")
        self._in_flight = True
        self._inbox.put_nowait(batch)

    def wait(self) -> Any:
        """The in-flight batch's result; re-raises what processing it raised."""
        if not self._in_flight:
            raise RuntimeError("output thread: no batch in flight")
        waited = 0.0
        while True:
            try:
                ok, value = self._results.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                waited += POLL_SECONDS
                if not self._thread.is_alive():
                    self._in_flight = False
                    raise OutputThreadError("output thread: died with a batch in flight") from None
                if waited >= self._timeout_seconds:
                    self._in_flight = False
                    raise OutputThreadError(f"output thread: no result within {self._timeout_seconds:.0f} s") from None
        self._in_flight = False
        if not ok:
            raise value
        return value

    def forget(self, req: Any) -> None:
        """The engine dropped req (an abort): nothing to free here, the thread works on the engine's own objects
        (the output side's interface, as `OutputProcess.forget`, which frees the child's copy)."""

    def shutdown(self, timeout_seconds: float = 5.0) -> None:
        """Stop the thread once its current batch is done (a result still queued is dropped)."""
        if not self._thread.is_alive():
            return
        while True:  # an untaken result must not block the thread's last put
            try:
                self._results.get_nowait()
            except queue.Empty:
                break
        try:
            self._inbox.put(_STOP, timeout=timeout_seconds)
        except queue.Full:
            return  # it is stuck in a batch: it is a daemon, the process may still exit
        self._thread.join(timeout_seconds)
        self._in_flight = False

    def _run(self) -> None:
        while True:
            batch = self._inbox.get()
            if batch is _STOP:
                return
            self.num_batches += 1
            try:
                result = (True, self._process(batch))
            except BaseException as exc:  # noqa: BLE001 - handed to the engine thread by wait()
                result = (False, exc)
            self._results.put(result)
