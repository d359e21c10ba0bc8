"""The engine loop: one background thread that owns the engine.

`LLMEngine` is not thread-safe, so exactly one thread touches it. HTTP
handlers (on the asyncio event loop) talk to it through a FIFO inbox of
commands, `add`, `abort` and `call` (a function of the engine run between
steps: sleep and wake, `engine/sleep/`); a `threading.Event` wakes the thread
when the inbox gains work. Each pass of the thread:

1. clears the wake flag, then applies every queued command in order (an abort
   queued after its add therefore always finds the request);
2. if the engine has unfinished requests, runs one `engine.step_deltas()` and
   hands each `RequestOutputDelta` (only what the step added: serving.py
   assembles the outputs) to the asyncio queue of the request that owns it,
   through `loop.call_soon_threadsafe` (the only safe way to touch an asyncio
   queue from another thread); with `--overlap thread|process` a step's deltas
   are those of the step before, made on the engine's output thread (or in
   its output process) during this step's forward (`engine/overlap/`), and a
   failure there (the output process dying included) raises from this call;
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
cleanly instead of being cancelled mid-write; `end_grace_now()` ends the
grace period at once (a second Ctrl-C). `stop()` does the same at once
and joins the thread; during the load it returns at once, and the engine,
once built, is shut down without ever being reported ready.

Failure: the whole pass is guarded. Whatever an engine call raises, other
than the `ValueError` by which `add_request` refuses a request (a 400 for
that request alone), leaves the engine in a state nobody can vouch for. The
thread then logs the traceback once, answers every in-flight request and
every queued add with `RequestFailed` (500, `internal_error`), sets
`engine_error` (so `healthy` is false and /health says 503) and `failed`,
and ends. The launcher waits on `failed` and exits the process non-zero, so
the kubelet restarts the pod instead of keeping a server that can only refuse.
Once the thread has ended, `add` answers at once: no request waits on an
inbox nobody reads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedinfer.contracts.http.errors import from_value_error

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
    max_chars_per_token: int | None = None  # prompt_chars.py; None: no sound bound for this tokenizer
    structured: Any = None  # the engine's StructuredOutputs: the server compiles grammars into its cache

    @property
    def num_token_ids(self) -> int:
        """Token ids below this are valid: known to both the tokenizer and the model."""
        return min(len(self.tokenizer), self.vocab_size)

    @property
    def max_prompt_chars(self) -> int | None:
        """Longer texts tokenize to at least max_model_len tokens, which no prompt may reach; None: unknown."""
        if self.max_chars_per_token is None:
            return None
        return (self.max_model_len - 1) * self.max_chars_per_token


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


def _unavailable() -> RequestFailed:
    return RequestFailed(503, "the engine is not available", code="engine_unavailable")


def _internal_error() -> RequestFailed:
    return RequestFailed(500, "internal engine error; the server is restarting", code="internal_error")


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


@dataclass(frozen=True)
class _Call:
    function: Callable[[Any], Any]  # of the engine; its ValueError goes to the caller, anything else fails the engine
    done: concurrent.futures.Future


def _asleep() -> RequestFailed:
    return RequestFailed(503, "the engine is asleep; POST /wake_up wakes it", code="asleep")


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
        self._inbox_closed = False  # the thread no longer reads the inbox; guarded by _inbox_lock
        self._inbox_lock = threading.Lock()
        self._load_lock = threading.Lock()  # `stop` during the load vs the load's end: one of them wins
        self.ready = threading.Event()
        self.failed = threading.Event()  # set once the thread ended on an unexpected exception
        self.info: ModelInfo | None = None
        self.stats: Any = None
        self.load_error: BaseException | None = None
        self.engine_error: BaseException | None = None
        self.sleeping = False  # set by the engine thread's sleep and wake calls (engine/server/sleep_routes.py)

    # ---- called from the event loop ----
    def start(self) -> None:
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return (
            self.ready.is_set()
            and self.info is not None
            and self.engine_error is None
            and not self._draining
            and self._thread.is_alive()
        )

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

    def add(
        self, request_id: str, prompt: str | list[int], params: Any, arrival_time: float, sink: RequestSink
    ) -> None:
        with self._inbox_lock:
            if self._inbox_closed:
                sink.push(_unavailable())
                return
            self._num_pending_seqs += params.n
            self._inbox.put(_Add(request_id, prompt, params, arrival_time, sink))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))
        self._wake.set()

    def call(self, function: Callable[[Any], Any]) -> asyncio.Future:
        """function(engine), run on the engine thread between steps, after every command queued before it."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._inbox_lock:
            if self._inbox_closed:
                done.set_exception(_unavailable())
            else:
                self._inbox.put(_Call(function, done))
        self._wake.set()
        return asyncio.wrap_future(done)

    def begin_drain(self, grace_seconds: float | None = None) -> None:
        """Refuse new requests; abort the in-flight ones after grace_seconds (None: let them finish)."""
        self._draining = True
        if grace_seconds is not None and self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + grace_seconds
        self._wake.set()

    def end_grace_now(self) -> None:
        """Drain, and abort every in-flight request at the next pass (a second Ctrl-C): each gets its 503."""
        self._draining = True
        self._drain_deadline = time.monotonic()
        self._wake.set()

    @property
    def loading(self) -> bool:
        """The thread is still building the engine (the model is loading)."""
        return self._thread.is_alive() and not self.ready.is_set()

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """Abort everything still in flight and join the thread; during the load, return at once.

        A load cannot be interrupted (it is torch and file reads on the
        engine thread), and waiting for it made SIGTERM wait as long as the
        model takes to load. The thread shuts the engine down as soon as it
        is built, without ever serving; the launcher ends the process
        without waiting for that (`launcher.py`).
        """
        with self._load_lock:
            self._draining = True
            self._stop_requested = True
            loading = self.loading
        self._wake.set()
        if self._thread.is_alive() and not loading:
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
        with self._load_lock:
            if self._stop_requested:  # shutdown began during the load: never report ready
                self.ready.set()
            else:
                self.info = info
                self.stats = engine.get_stats()
                self._notify("on_ready", info)
                self._notify("on_stats", self.stats)
                self.ready.set()
                logger.info(
                    "engine ready: model %s, %d KV blocks of %d tokens",
                    info.served_model_name,
                    info.num_gpu_blocks,
                    info.block_size,
                )
        if self.info is None:
            logger.info("the model loaded after shutdown began; stopping the engine")
            engine.shutdown()
            return
        try:
            self._serve(engine)
        except BaseException as exc:  # noqa: BLE001 - see "Failure" above
            self._fail(exc)
        finally:
            engine.shutdown()  # a tensor-parallel engine's other ranks stop with it

    def _serve(self, engine: Any) -> None:
        while not self._stop_requested:
            self._wake.clear()
            num_applied_seqs = self._apply_inbox(engine)
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline and self._sinks:
                self._abort_all(engine, "the server is shutting down: the grace period ended")
            if engine.has_unfinished_requests():
                self._step(engine)
                self._settle_pending(num_applied_seqs)
            else:
                self._publish_stats(engine)
                self._settle_pending(num_applied_seqs)
                engine.check_health()  # a dead tensor-parallel rank fails the server now, not at the next request
                self._wake.wait(IDLE_WAIT_SECONDS)
        num_applied_seqs = self._apply_inbox(engine)
        self._abort_all(engine, "the server is shutting down")
        self._publish_stats(engine)
        self._settle_pending(num_applied_seqs)
        self._close_inbox(_unavailable)

    def _fail(self, exc: BaseException) -> None:
        """The engine raised unexpectedly: answer everyone with a 500 and end (the launcher exits non-zero)."""
        logger.critical("the engine failed; failing every in-flight request, the server exits", exc_info=exc)
        self.engine_error = exc
        for request_id, sink in self._sinks.items():
            sink.push(_internal_error())
            self._notify("on_abort", request_id)
        self._sinks.clear()
        self._close_inbox(_internal_error)
        self.failed.set()

    def _close_inbox(self, failure: Callable[[], RequestFailed]) -> None:
        """Stop reading the inbox; answer each add still in it with a `failure()` of its own."""
        with self._inbox_lock:
            self._inbox_closed = True
            while True:
                try:
                    command = self._inbox.get_nowait()
                except queue.Empty:
                    return
                if isinstance(command, _Add):
                    self._num_pending_seqs -= command.params.n
                    command.sink.push(failure())
                elif isinstance(command, _Call):
                    command.done.set_exception(failure())

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
            if isinstance(command, _Call):
                self._run_call(engine, command)
                continue
            num_applied_seqs += command.params.n
            self._add(engine, command)

    def _settle_pending(self, num_seqs: int) -> None:
        """Stop counting applied adds as pending, once the published stats include them."""
        with self._inbox_lock:
            self._num_pending_seqs -= num_seqs

    def _run_call(self, engine: Any, command: _Call) -> None:
        try:
            result = command.function(engine)
        except ValueError as exc:  # refused (e.g. sleep with requests in flight): the engine is unchanged
            command.done.set_exception(exc)
            return
        except BaseException as exc:
            command.done.set_exception(_internal_error())
            raise exc
        command.done.set_result(result)

    def _add(self, engine: Any, command: _Add) -> None:
        if self._stop_requested or self._draining:
            command.sink.push(RequestFailed(503, "the server is shutting down", code="shutting_down"))
            return
        if self.sleeping:
            command.sink.push(_asleep())
            return
        self._sinks[command.request_id] = command.sink  # before the call: a failure inside it answers this one too
        try:
            engine.add_request(command.request_id, command.prompt, command.params, arrival_time=command.arrival_time)
        except ValueError as exc:
            del self._sinks[command.request_id]
            error = from_value_error(exc)
            command.sink.push(RequestFailed(error.status_code, error.message, error.param, error.code))

    def _step(self, engine: Any) -> None:
        outputs = engine.step_deltas()
        for output in outputs:
            sink = self._sinks.get(output.request_id)
            if sink is None:
                continue
            if output.finished:
                del self._sinks[output.request_id]
            sink.push(output)
        self._notify("on_outputs", outputs)
        self._publish_stats(engine)

    def _abort_all(self, engine: Any, message: str) -> None:
        """Abort every in-flight request and answer each with a 503 (shutdown)."""
        request_ids = list(self._sinks)
        if not request_ids:
            return
        engine.abort_request(request_ids)
        for request_id in request_ids:
            self._sinks.pop(request_id).push(RequestFailed(503, message, code="shutting_down"))
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
