"""The output process: one step's output work in a child process, on another core, while the next forward runs.

The same lockstep protocol as the output thread (`thread.py`): `submit(batch)`
returns at once, the engine runs the next forward, `wait()` takes the result;
one batch in flight. Only a second process escapes the GIL: the engine
thread's forward never waits for Python work of the output side.

The engine side (`OutputProcess`) turns each `OutputBatch` into a
`mirror.StepMessage` of what changed (new tokens, per touched request what the
engine owns, new requests once with their first token, aborted requests'
keys); the child (`serve`) keeps the output-side state in an
`mirror.OutputMirror` and answers with the outputs and the (request, seq)
pairs its stop strings ended, which `wait` maps back to the engine's objects
(attaching each request's own `metrics`, as the other modes share them).

Invariants:
- the child is a fresh interpreter (`subprocess`, as multiprocessing's
  `spawn`: never a fork of a process holding torch's threads) importing the
  tokenizer only, never from the working directory (`child_python.py`);
  its ready message (or its load error) is awaited at start;
- at most one batch is in flight; every wait is bounded: `wait` polls in
  slices of `POLL_SECONDS`, raises `OutputProcessError` if the child has
  died or `timeout_seconds` passed, never hangs;
- an exception raised in the child while processing a batch is re-raised
  by `wait` (pickled; if it cannot be, a RuntimeError with its traceback),
  as the output thread's is;
- the child exits when the engine process dies (its pipe reads EOF) or on
  `shutdown` (the engine closes its pipe; a bounded wait, then a kill;
  idempotent).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pagedinfer.engine.child_python import child_python_argv
from pagedinfer.engine.outputs import CompletionDelta, CompletionOutput, RequestOutput, RequestOutputDelta
from pagedinfer.engine.overlap.mirror import NewRequest, OutputMirror, StepMessage, StepReply, TextParams
from pagedinfer.engine.overlap.text import OutputBatch, ProcessedBatch
from pagedinfer.engine.overlap.thread import POLL_SECONDS

PICKLE_PROTOCOL = 5
START_TIMEOUT_SECONDS = 120.0  # the child imports transformers and loads the tokenizer
_CHILD_CODE = "import sys; from pagedinfer.engine.overlap.process import serve; serve(*sys.argv[1:])"


class OutputProcessError(RuntimeError):
    """The output process died or did not answer in time."""


@dataclass
class CrossingStats:
    """What crossing the pipe cost in thread CPU seconds (a shared machine's wall clock counts the waits for a
    core), summed over batches: the engine side builds, pickles and sends each message, receives, unpickles and
    maps back each reply; the child unpickles and pickles."""

    num_batches: int = 0
    engine_seconds: float = 0.0
    child_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0


class OutputProcess:
    def __init__(self, tokenizer_path: str, timeout_seconds: float = 600.0) -> None:
        self._timeout_seconds = timeout_seconds
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        try:
            self._proc = subprocess.Popen(
                child_python_argv(code=_CHILD_CODE, args=(to_child_r, from_child_w, tokenizer_path)),
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(from_child_r, writable=False)
        self._in_flight = False
        self._closed = False
        self._keys: dict[str, int] = {}  # request id -> key, from its first shipped token to its end
        self._reqs: dict[int, Any] = {}  # key -> the engine's EngineRequest
        self._next_key = 0
        self._frees: list[int] = []
        self._batch: OutputBatch | None = None
        self.num_batches = 0  # processed by the child (its own count)
        self.num_child_requests = 0  # requests whose state the child holds (after its last batch)
        self.crossing = CrossingStats()
        try:
            self.pid, _ = self._receive(START_TIMEOUT_SECONDS, "starting")
        except BaseException:
            self.shutdown()
            raise

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    def submit(self, batch: OutputBatch) -> None:
        """Send the batch's changes to the child (returns once written)."""
        if self._in_flight:
            raise RuntimeError("output process: a batch is already in flight; wait() for it first")
        if self._closed:
            raise OutputProcessError("output process: shut down")
        if self._proc.poll() is not None:
            raise OutputProcessError(f"output process: died (exit code {self._proc.returncode})")
        start = time.thread_time()
        data = pickle.dumps(self._message(batch), protocol=PICKLE_PROTOCOL)
        self._in_flight = True
        self._batch = batch
        try:
            self._send.send_bytes(data)
        except OSError as exc:
            self._in_flight = False
            raise OutputProcessError(f"output process: cannot send a batch: {exc}") from None
        self.crossing.bytes_sent += len(data)
        self.crossing.engine_seconds += time.thread_time() - start

    def wait(self) -> ProcessedBatch:
        """The in-flight batch's result, mapped to the engine's objects; re-raises what the child raised."""
        if not self._in_flight:
            raise RuntimeError("output process: no batch in flight")
        try:
            reply, start = self._receive(self._timeout_seconds, "processing a batch")
        finally:
            self._in_flight = False
        processed = self._processed(reply)
        self.crossing.num_batches += 1
        self.crossing.engine_seconds += time.thread_time() - start
        return processed

    def forget(self, req: Any) -> None:
        """The engine dropped req (an abort): the child frees its state with the next batch."""
        key = self._keys.pop(req.request_id, None)
        if key is not None and self._reqs.get(key) is req:
            del self._reqs[key]
            self._frees.append(key)

    def shutdown(self, timeout_seconds: float = 30.0) -> None:
        """Close the pipe (the child exits on its EOF), wait for it, kill it if it does not exit; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._in_flight = False
        for conn in (self._send, self._recv):
            conn.close()
        try:
            self._proc.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout_seconds)

    # ----- the crossing ----------------------------------------------------------------------
    def _message(self, batch: OutputBatch) -> StepMessage:
        keys, reqs = self._keys, self._reqs
        news: list[NewRequest] = []
        touched = []
        for req in batch.requests:
            key = keys.get(req.request_id)
            if key is None:
                key = keys[req.request_id] = self._next_key
                self._next_key += 1
                reqs[key] = req
                news.append(_new_request(key, req))
            touched.append((key, req.seqs[0].num_cached_tokens, req.outputs if req.beam is not None else None))
        tokens = [
            (
                keys[item.seq.request_id],
                item.seq.index,
                item.token,
                item.logprobs,
                item.num_output_tokens,
                item.early_finish,
                item.early_stop_reason,
                item.late_finish,
            )
            for item in batch.items
        ]
        frees, self._frees = self._frees, []
        return StepMessage(batch.cumulative, frees, news, tokens, touched)

    def _processed(self, reply: StepReply) -> ProcessedBatch:
        self.num_batches, self.num_child_requests = reply.num_batches, reply.num_requests
        reqs = self._reqs
        stopped = [reqs[key].seqs[index] for key, index in reply.stopped if key in reqs]  # before any is dropped
        output_cls, completion_cls = (
            (RequestOutput, CompletionOutput) if self._batch.cumulative else (RequestOutputDelta, CompletionDelta)
        )
        outputs = []
        for key, finished, num_cached_tokens, completions, prompt_logprobs in reply.outputs:
            req = reqs.get(key)
            if req is None:  # aborted while its batch was in flight: dropped
                continue
            if finished:
                del reqs[key]
                del self._keys[req.request_id]
            output = output_cls(
                request_id=req.request_id,
                prompt=req.prompt,
                prompt_token_ids=req.prompt_token_ids,
                num_cached_tokens=num_cached_tokens,
                outputs=[completion_cls(*fields) for fields in completions],
                finished=finished,
                metrics=req.metrics,
                prompt_logprobs=prompt_logprobs,
            )
            outputs.append((req, output, finished))
        return ProcessedBatch(outputs, stopped)

    def _receive(self, timeout_seconds: float, doing: str) -> tuple[Any, float]:
        """The child's next answer and when it began to be read; raises what the child raised."""
        waited = 0.0
        while not self._recv.poll(POLL_SECONDS):
            waited += POLL_SECONDS
            if self._proc.poll() is not None:
                raise OutputProcessError(f"output process: died while {doing} (exit code {self._proc.returncode})")
            if waited >= timeout_seconds:
                raise OutputProcessError(f"output process: no answer within {timeout_seconds:.0f} s while {doing}")
        start = time.thread_time()
        try:
            data = self._recv.recv_bytes()
        except (EOFError, OSError):  # the pipe closed under the answer: the child is gone
            raise OutputProcessError(f"output process: died while {doing}") from None
        ok, value, child_seconds = pickle.loads(data)
        if not ok:
            raise value
        self.crossing.bytes_received += len(data)
        self.crossing.child_seconds += child_seconds
        return value, start


def _new_request(key: int, req: Any) -> NewRequest:
    if req.beam is not None:
        return NewRequest(key, req.request_id, req.prompt, req.prompt_token_ids, None, 1, None)
    p = req.params
    text = TextParams(
        p.stop_strings, p.include_stop_str_in_output, p.min_tokens, p.skip_special_tokens, p.logprobs is not None
    )
    return NewRequest(
        key,
        req.request_id,
        req.prompt,
        req.prompt_token_ids,
        text,
        p.n,
        list(req.prompt_logprobs) if req.prompt_logprobs is not None else None,
    )


# ----- the child ---------------------------------------------------------------------------------
def serve(read_fd: str, write_fd: str, tokenizer_path: str) -> None:
    """The child's main: load the tokenizer, say ready, then answer batches until the pipe closes."""
    recv, send = Connection(int(read_fd), writable=False), Connection(int(write_fd), readable=False)

    unreported = [0.0]  # the previous answer's pickling seconds: they ride with the next answer

    def reply(ok: bool, value: Any, seconds: float) -> None:
        start = time.thread_time()
        try:
            data = pickle.dumps((ok, value, seconds + unreported[0]), protocol=PICKLE_PROTOCOL)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
            data = pickle.dumps((False, RuntimeError(f"output process: {traceback.format_exc()}"), 0.0))
        unreported[0] = time.thread_time() - start
        send.send_bytes(data)

    try:
        from pagedinfer.engine.engine_setup import load_tokenizer

        mirror = OutputMirror(load_tokenizer(tokenizer_path))
    except BaseException as exc:  # noqa: BLE001 - the engine re-raises it
        reply(False, exc, 0.0)
        return
    reply(True, os.getpid(), 0.0)
    while True:
        try:
            data = recv.recv_bytes()
        except (EOFError, OSError):  # the engine shut us down, or died: nothing to flush, skip the teardown
            os._exit(0)
        start = time.thread_time()
        message = pickle.loads(data)
        unpickle_seconds = time.thread_time() - start
        try:
            reply(True, mirror.apply(message), unpickle_seconds)
        except BaseException as exc:  # noqa: BLE001 - handed to the engine by wait()
            reply(False, exc, unpickle_seconds)
