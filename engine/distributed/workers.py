"""Rank 0's side: start ranks 1..N-1 as child processes, watch them, stop them.

The children are `python -P -m pagedinfer.engine.distributed.worker` processes
(`child_python.py`: never importing from the working directory; not
multiprocessing: nothing of the user's __main__ is re-run). Everything between
rank 0 and a child goes through the replica's TCPStore: rank 0 puts the
pickled engine config at `config`; the child says `rank<r>/started` once
connected, `rank<r>/ready` (a JSON of its parameter bytes) once its shard is
loaded, or `rank<r>/error`. Its stderr passes through rank 0 (`stderr_tail.py`),
which keeps the last lines.

Start-up contract: every wait of rank 0 (the children starting, the group's
rendezvous, their shards loading) polls the children every `_POLL_SECONDS`; a
child that exits, at any moment and before its handshake too (dying while
importing, it never reaches the store), fails the start with a
TensorParallelError naming its rank, its exit code or signal, its stored error
if any, and its last lines of stderr; one still alive but not started
(connected to the store) after the store's timeout is named too. Rank 0 looks
at the store through a connection of its own (`_watch_store`), never the one
the group's rendezvous may be blocked on. A child that dies inside the
rendezvous leaves that blocked daemon thread behind until the store's timeout;
waiting for every `rank<r>/started` first keeps that window to the rendezvous
itself.

Failure contract: if a child exits or raises, rank 0's next (or current)
collective fails within about a second (gloo reports the closed connection);
`guard()` turns that into a RuntimeError naming the rank and its error, stops
the other children, and every later step raises the same error. A child never
outlives rank 0: it polls its parent pid (SIGTERM or SIGKILL of rank 0 alike),
and a dead rank 0 also closes its gloo connections.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass

import torch

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine.child_python import child_python_argv
from pagedinfer.engine.distributed import step_message
from pagedinfer.engine.distributed.channel import StepChannel
from pagedinfer.engine.distributed.group import STORE_TIMEOUT, TPGroup, connect_store, create_store
from pagedinfer.engine.distributed.stderr_tail import StderrTail
from pagedinfer.engine.distributed.step_message import Message

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.05
_FAILURE_WAIT_SECONDS = 5.0  # after a failed collective: how long to wait for the culprit to exit
_STOP_WAIT_SECONDS = 10.0
_STDERR_WAIT_SECONDS = 1.0  # after a child's exit: how long to wait for the end of its stderr


@dataclass(frozen=True)
class RankReport:
    """What a rank says once its shard is loaded."""

    rank: int
    weight_bytes: int  # all its parameters and buffers
    sharded_weight_bytes: int  # those of the layers the tensor-parallel plan splits
    num_packed_linears: int  # its linear layers packed for oneDNN (engine/cpu/linear.py; CPU only)


class TensorParallelError(RuntimeError):
    """A rank of the replica failed; the engine cannot step any more."""


def _terminate(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(_STOP_WAIT_SECONDS)


class WorkerSet:
    """Ranks 1..N-1 of one replica, as seen from rank 0."""

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        n = config.tensor_parallel_size
        self.world_size = n
        self.store = create_store(n)
        self._watch_store = connect_store(self.store.port, None)
        self.procs: list[subprocess.Popen] = []
        self._stderr: list[StderrTail] = []  # rank r's at r - 1, as procs
        self.reports: list[RankReport] = []
        self.error: TensorParallelError | None = None
        self._finalizer = weakref.finalize(self, _terminate, self.procs)
        self.store.set("config", pickle.dumps(config))
        for rank in range(1, n):
            argv = child_python_argv(
                module="pagedinfer.engine.distributed.worker",
                args=(
                    "--rank",
                    rank,
                    "--world-size",
                    n,
                    "--store-port",
                    self.store.port,
                    "--parent-pid",
                    os.getpid(),
                    "--num-threads",
                    torch.get_num_threads(),
                ),
            )
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.procs.append(proc)
            self._stderr.append(StderrTail(proc.stderr, f"rank{rank}"))
        self._wait_for("started", "starting", STORE_TIMEOUT.total_seconds())
        self.group = self._while_alive(lambda: TPGroup.join(self.store, 0, n, device), "joining the process group")
        self.channel = StepChannel(
            self.group, step_message.capacity_words(config.max_num_batched_tokens, config.max_num_seqs)
        )

    # ----- start-up -------------------------------------------------------------------
    def _while_alive(self, fn, what: str):
        """fn() in a thread, while watching the children: a child that dies is named, never waited on."""
        result: list = []
        thread = threading.Thread(target=lambda: result.append(_capture(fn)), name="pagedinfer-tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(_POLL_SECONDS)
            self._raise_if_dead(what)
        value, exc = result[0]
        if exc is not None:
            self.shutdown()
            raise exc
        return value

    def _wait_for(self, key: str, what: str, timeout_seconds: float | None = None) -> dict[int, bytes]:
        """Every child's `rank<r>/<key>`, polled while watching the children (a dead one is named; one
        still silent after `timeout_seconds`, if given, too)."""
        values: dict[int, bytes] = {}
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while len(values) < self.world_size - 1:
            for rank in range(1, self.world_size):
                if rank not in values and self._watch_store.check([f"rank{rank}/{key}"]):
                    values[rank] = self._watch_store.get(f"rank{rank}/{key}")
            self._raise_if_dead(what)
            if len(values) == self.world_size - 1:
                break
            if deadline is not None and time.monotonic() > deadline:
                rank = min(set(range(1, self.world_size)) - set(values))
                self._fail(
                    TensorParallelError(
                        f"tensor-parallel rank {rank} (pid {self.procs[rank - 1].pid}) is"
                        f" still alive but did not finish {what} in {timeout_seconds:.0f} s"
                    )
                )
            time.sleep(_POLL_SECONDS)
        return values

    def wait_ready(self) -> None:
        """Block until every child has loaded its shard (or raise naming the one that failed)."""
        for rank, value in sorted(self._wait_for("ready", "loading the model").items()):
            info = json.loads(value)
            self.reports.append(
                RankReport(rank, info["weight_bytes"], info["sharded_weight_bytes"], info["num_packed_linears"])
            )

    # ----- health ---------------------------------------------------------------------
    def _rank_error(self, rank: int, proc: subprocess.Popen) -> str:
        """How an exited child ended: its exit, its own error (from the store), its last lines of stderr."""
        parts = [_exit_description(proc.returncode)]
        if self._watch_store.check([f"rank{rank}/error"]):
            parts.append(self._watch_store.get(f"rank{rank}/error").decode(errors="replace"))
        message = ": ".join(parts)
        tail = self._stderr[rank - 1].text(_STDERR_WAIT_SECONDS)
        if tail:
            message += "\nits stderr ended with:\n" + "\n".join(f"    {line}" for line in tail.splitlines())
        return message

    def _raise_if_dead(self, what: str) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            if proc.poll() is not None:
                self._fail(
                    TensorParallelError(
                        f"tensor-parallel rank {rank} (pid {proc.pid}) failed while {what}: "
                        f"{self._rank_error(rank, proc)}"
                    )
                )

    def _fail(self, error: TensorParallelError) -> None:
        self.error = error
        logger.error("stopping the replica: %s", error)
        _terminate(self.procs)
        raise error

    def check(self) -> None:
        """Raise the replica's error if a rank has failed (a non-blocking look at the children)."""
        if self.error is not None:
            raise self.error
        self._raise_if_dead("idle")

    @contextlib.contextmanager
    def guard(self, what: str):
        """Run a collective section; any failure is reported as the rank that caused it."""
        if self.error is not None:
            raise self.error
        self._raise_if_dead(what)
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, Exception):  # e.g. KeyboardInterrupt mid-step: the ranks are out of step
                self.error = TensorParallelError(
                    f"tensor-parallel step interrupted while {what} ({type(exc).__name__}); the replica was stopped"
                )
                _terminate(self.procs)
                raise
            deadline = time.monotonic() + _FAILURE_WAIT_SECONDS
            while time.monotonic() < deadline:
                self._raise_if_dead(what)  # raises, naming the dead rank
                time.sleep(_POLL_SECONDS)
            self._fail(
                TensorParallelError(f"tensor-parallel step failed on rank 0 while {what}: {type(exc).__name__}: {exc}")
            )

    def send(self, message: Message) -> None:
        self.channel.send(message)

    # ----- stop -----------------------------------------------------------------------
    def shutdown(self) -> None:
        """Tell the children to stop (if they still listen), then make sure they are gone."""
        if self.error is None and all(p.poll() is None for p in self.procs):
            with contextlib.suppress(Exception):
                self.channel.send(Message(step_message.STOP))
            deadline = time.monotonic() + _STOP_WAIT_SECONDS
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                time.sleep(_POLL_SECONDS)
        _terminate(self.procs)
        self._finalizer.detach()


def _exit_description(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def _capture(fn):
    try:
        return fn(), None
    except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's thread
        return None, exc
