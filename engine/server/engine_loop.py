"""The engine loop: one background thread that owns the engine.

`LLMEngine` is not thread-safe, so exactly one thread touches it. HTTP
handlers (on the asyncio event loop) talk to it through a FIFO inbox of
commands, `add` and `abort`; a `threading.Event` wakes the thread when the
inbox gains work. Each pass of the thread:

1. clears the wake flag, then applies every queued command in order (an abort
   queued after its add therefore always finds the request);
2. if the engine has unfinished requests, runs one `engine.step()` and hands
   each `RequestOutput` to the asyncio queue of the request that owns it,
   through `loop.call_soon_threadsafe` (the only safe way to touch an asyncio
   queue from another thread);
3. otherwise sleeps on the wake flag.

Invariants: a request id is in `_sinks` from its add until its finished
output or its abort, so every add is answered exactly once, either with a
finished output, a `RequestFailed`, or (for aborts the client asked for)
nothing. Aborts free the request's KV blocks at once (`engine.abort_request`).
The latest `EngineStats` snapshot is swapped in after every pass, so readers
(/metrics, admission control) never touch the engine.

Shutdown: `begin_drain(grace_seconds)` refuses new work while in-flight
requests run on; once the grace period is over the thread aborts whatever
is left and answers each with `RequestFailed` (503), so their responses end
cleanly instead of being cancelled mid-write. `stop()` does the same at once
and joins the thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pagedinfer.engine.server.errors import from_value_error

logger = logging.getLogger("pagedinfer.server")

IDLE_WAIT_SECONDS = 0.5


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP layer needs to know about the loaded model."""

    served_model_name: str
    max_model_len: int
    max_num_seqs: int  # the most completions (n) one request may ask for
    vocab_size: int  # the model's; token ids at or above it (or len(tokenizer)) are refused
    block_size: int
    num_gpu_blocks: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    tokenizer: Any  # the server's own copy, apart from the engine's (see serving.py)

    @property
    def num_token_ids(self) -> int:
        """Token ids below this are valid: known to both the tokenizer and the model."""
        return min(len(self.tokenizer), self.vocab_size)


class RequestFailed(Exception):
    """Delivered to a request's queue when the engine could not finish it."""

    def __init__(self, status_code: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code


class RequestSink:
    """The asyncio side of one HTTP request: a queue fed from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def push(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass  # the event loop is closed: nobody is listening any more


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: str | list[int]
    params: Any
    arrival_time: float
    sink: RequestSink


@dataclass(frozen=True)
class _Abort:
    request_id: str


class EngineLoop:
    """Builds the engine on its own thread, then steps it while work exists.

    engine_factory() -> (engine, ModelInfo); the observer (the metrics) gets
    `on_ready(info)`, `on_outputs(outputs)`, `on_abort(request_id)` and
    `on_stats(stats)` calls, all from the engine thread.
    """

    def __init__(self, engine_factory: Callable[[], tuple[Any, ModelInfo]], observer: Any = None) -> None:
        self._factory = engine_factory
        self._observer = observer
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pagedinfer-engine", daemon=True)
        self._sinks: dict[str, RequestSink] = {}
        self._stop_requested = False
        self._draining = False
        self._drain_deadline: float | None = None
        self._num_pending_seqs = 0
        self._pending_lock = threading.Lock()
        self.ready = threading.Event()
        self.info: ModelInfo | None = None
        self.stats: Any = None
        self.load_error: BaseException | None = None
        self.engine_error: BaseException | None = None

    # ---- called from the event loop ----
    def start(self) -> None:
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self.ready.is_set() and self.info is not None and self.engine_error is None and not self._draining

    @property
    def accepting(self) -> bool:
        return self.healthy and not self._stop_requested

    def num_waiting_sequences(self) -> int:
        """Sequences not yet running: the engine's waiting queue plus adds (n sequences each) not yet in it.

        An add stays pending until the stats published after it was applied
        include it, so between the two it is counted twice, never zero times.
        """
        waiting = self.stats.num_waiting_seqs if self.stats is not None else 0
        return waiting + self._num_pending_seqs

    def add(self, request_id: str, prompt: str | list[int], params: Any, arrival_time: float,
            sink: RequestSink) -> None:
        with self._pending_lock:
            self._num_pending_seqs += params.n
        self._inbox.put(_Add(request_id, prompt, params, arrival_time, sink))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))
        self._wake.set()

    def begin_drain(self, grace_seconds: float | None = None) -> None:
        """Refuse new requests; abort the in-flight ones after grace_seconds (None: let them finish)."""
        self._draining = True
        if grace_seconds is not None and self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + grace_seconds
        self._wake.set()

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """Abort everything still in flight and join the thread."""
        self._draining = True
        self._stop_requested = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)

    # ---- the engine thread ----
    def _run(self) -> None:
        try:
            engine, info = self._factory()
        except BaseException as exc:  # noqa: BLE001 - reported by the server, which then exits
            if isinstance(exc, ValueError):
                logger.error("loading the engine failed: %s", exc)
            else:
                logger.exception("loading the engine failed")
            self.load_error = exc
            self.ready.set()
            return
        self.info = info
        self.stats = engine.get_stats()
        self._notify("on_ready", info)
        self._notify("on_stats", self.stats)
        self.ready.set()
        logger.info("engine ready: model %s, %d KV blocks of %d tokens", info.served_model_name,
                    info.num_gpu_blocks, info.block_size)
        while not self._stop_requested:
            self._wake.clear()
            num_applied_seqs = self._apply_inbox(engine)
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline and self._sinks:
                self._abort_all(engine, "the server is shutting down: the grace period ended")
            if self.engine_error is None and engine.has_unfinished_requests():
                self._step(engine)
                self._settle_pending(num_applied_seqs)
            else:
                self._publish_stats(engine)
                self._settle_pending(num_applied_seqs)
                self._check_health(engine)
                self._wake.wait(IDLE_WAIT_SECONDS)
        num_applied_seqs = self._apply_inbox(engine)
        self._abort_all(engine, "the server is shutting down")
        self._publish_stats(engine)
        self._settle_pending(num_applied_seqs)
        engine.shutdown()  # a tensor-parallel engine's other ranks stop with it

    def _apply_inbox(self, engine: Any) -> int:
        """Apply every queued command in order; the number of sequences the adds among them asked for."""
        num_applied_seqs = 0
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return num_applied_seqs
            if isinstance(command, _Abort):
                if self._sinks.pop(command.request_id, None) is not None:
                    engine.abort_request(command.request_id)
                    self._notify("on_abort", command.request_id)
                continue
            num_applied_seqs += command.params.n
            self._add(engine, command)

    def _settle_pending(self, num_seqs: int) -> None:
        """Stop counting applied adds as pending, once the published stats include them."""
        with self._pending_lock:
            self._num_pending_seqs -= num_seqs

    def _add(self, engine: Any, command: _Add) -> None:
        if self.engine_error is not None:
            command.sink.push(RequestFailed(503, "the engine is not available", code="engine_unavailable"))
            return
        if self._stop_requested or self._draining:
            command.sink.push(RequestFailed(503, "the server is shutting down", code="shutting_down"))
            return
        try:
            engine.add_request(command.request_id, command.prompt, command.params,
                               arrival_time=command.arrival_time)
        except ValueError as exc:
            error = from_value_error(exc)
            command.sink.push(RequestFailed(error.status_code, error.message, error.param, error.code))
            return
        self._sinks[command.request_id] = command.sink

    def _step(self, engine: Any) -> None:
        try:
            outputs = engine.step()
        except Exception as exc:  # noqa: BLE001 - a bug in the engine must not hang every client
            logger.exception("engine step failed; failing all in-flight requests")
            self.engine_error = exc
            self._abort_all(engine, "internal engine error", status_code=500, code="internal_error")
            return
        for output in outputs:
            sink = self._sinks.get(output.request_id)
            if sink is None:
                continue
            if output.finished:
                del self._sinks[output.request_id]
            sink.push(output)
        self._notify("on_outputs", outputs)
        self._publish_stats(engine)

    def _check_health(self, engine: Any) -> None:
        """While idle: a dead tensor-parallel rank makes the server unhealthy now, not at the next request."""
        if self.engine_error is not None:
            return
        try:
            engine.check_health()
        except Exception as exc:  # noqa: BLE001 - reported through /health and every later request
            logger.error("engine unhealthy: %s", exc)
            self.engine_error = exc

    def _abort_all(self, engine: Any, message: str, status_code: int = 503, code: str = "shutting_down") -> None:
        request_ids = list(self._sinks)
        if not request_ids:
            return
        try:
            engine.abort_request(request_ids)
        except Exception:  # noqa: BLE001
            logger.exception("aborting requests failed")
        for request_id in request_ids:
            self._sinks.pop(request_id).push(RequestFailed(status_code, message, code=code))
            self._notify("on_abort", request_id)

    def _publish_stats(self, engine: Any) -> None:
        try:
            self.stats = engine.get_stats()
        except Exception:  # noqa: BLE001
            logger.exception("engine.get_stats failed")
            return
        self._notify("on_stats", self.stats)

    def _notify(self, method: str, payload: Any) -> None:
        if self._observer is None:
            return
        try:
            getattr(self._observer, method)(payload)
        except Exception:  # noqa: BLE001 - metrics must never take the engine down
            logger.exception("metrics observer %s failed", method)
