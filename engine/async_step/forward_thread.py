"""The forward thread: the steps' forwards, in order, on a second thread (async scheduling).

While a job's forward runs here (torch releases the GIL inside its ops), the
engine thread schedules the next step and turns the previous one's tokens
into outputs (`stepper.py`).

Invariants:
- jobs run in submission order, one at a time: a job's table deltas, block
  moves and forward start only after the previous job's forward returned, so
  a block the engine thread frees or hands to another sequence after a job
  was submitted is only ever written by later jobs, in order;
- a job with placeholder tokens waits, after its block moves and metadata
  and before its forward, for its `Handover`: the previous job's sampled
  tokens as a tensor on the runner's device, scattered into its input ids
  there (no host round trip between one step's sampling and the next
  forward's input);
- every wait is bounded: waits poll in slices of `POLL_SECONDS` and raise
  `ForwardThreadError` if the other side is gone or `timeout_seconds`
  passed, never hang; an exception raised by a job is re-raised by `wait`
  on the engine thread;
- `shutdown` cancels the pending hand-overs it is given, stops the thread
  (a sentinel, then a bounded join) and is idempotent.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

POLL_SECONDS = 0.5
_STOP = object()


class ForwardThreadError(RuntimeError):
    """The forward thread died, a hand-over was cancelled, or a wait timed out."""


class Handover:
    """One job's sampled tokens for the next job's placeholders: given once by the engine thread, awaited by
    the forward thread (or cancelled, which fails the waiting job)."""

    def __init__(self, timeout_seconds: float = 600.0) -> None:
        self._event = threading.Event()
        self._timeout_seconds = timeout_seconds
        self._positions: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._cancelled = False

    @property
    def given(self) -> bool:
        return self._event.is_set()

    def give(self, positions: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
        """input_ids[positions] = values in the waiting job (None: nothing to write)."""
        self._positions, self._values = positions, values
        self._event.set()

    def cancel(self) -> None:
        if not self._event.is_set():
            self._cancelled = True
            self._event.set()

    def fill(self, input_ids: torch.Tensor) -> None:
        """On the forward thread: wait for the tokens, then write them into `input_ids` (the job's, on its device)."""
        if not self._event.wait(self._timeout_seconds):
            raise ForwardThreadError(f"async scheduling: no sampled tokens within {self._timeout_seconds:.0f} s")
        if self._cancelled:
            raise ForwardThreadError("async scheduling: the engine thread gave up this step")
        if self._positions is not None:
            input_ids[self._positions] = self._values


class Job:
    """One forward to run; its result (or exception) is taken by `ForwardThread.wait`."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class ForwardThread:
    def __init__(self, timeout_seconds: float = 600.0) -> None:
        self._timeout_seconds = timeout_seconds
        self._inbox: queue.Queue = queue.Queue()
        self.num_jobs = 0  # jobs run (on this thread)
        self._thread = threading.Thread(target=self._run, name="pagedinfer-forward", daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def submit(self, job: Job) -> None:
        """Queue a job (returns at once)."""
        if not self._thread.is_alive():
            raise ForwardThreadError("forward thread: not running")
        self._inbox.put_nowait(job)

    def wait(self, job: Job) -> Any:
        """The job's result; re-raises what running it raised."""
        waited = 0.0
        while not job.done.wait(POLL_SECONDS):
            waited += POLL_SECONDS
            if not self._thread.is_alive():
                raise ForwardThreadError("forward thread: died with a job in flight")
            if waited >= self._timeout_seconds:
                raise ForwardThreadError(f"forward thread: no result within {self._timeout_seconds:.0f} s")
        if job.error is not None:
            raise job.error
        return job.value

    def shutdown(self, pending: tuple[Handover, ...] = (), timeout_seconds: float = 5.0) -> None:
        """Cancel `pending` (so no job waits for them), then stop the thread after its queued jobs."""
        for handover in pending:
            handover.cancel()
        if not self._thread.is_alive():
            return
        self._inbox.put(_STOP)
        self._thread.join(timeout_seconds)

    def _run(self) -> None:
        while True:
            job = self._inbox.get()
            if job is _STOP:
                return
            self.num_jobs += 1
            try:
                job.value = job.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the engine thread by wait()
                job.error = exc
            job.done.set()
