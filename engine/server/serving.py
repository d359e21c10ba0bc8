"""From a validated HTTP request to engine requests, and their outputs back.

`Serving.prepare_*` turn a completion or chat request into a `Plan`: the
prompts as token ids, one `SamplingParams`, and the bookkeeping the response
needs. Everything a client can get wrong is checked here, before the engine
sees it and before any response starts, so the answer is a 4xx naming the
parameter:
- the model name (404), admission (503 + Retry-After while loading or
  draining, and a first look at the waiting-queue limit, so an overloaded
  server refuses before tokenizing);
- n above the engine's max_num_seqs, strings that are not valid Unicode
  (lone surrogates, which JSON escapes can spell), empty prompts,
  token ids the model or the tokenizer does not know (also those that text
  with a tokenizer's added tokens tokenizes to), prompt + max_tokens over
  max_model_len (400).

A text prompt longer than max_model_len tokens can hold
(`ModelInfo.max_prompt_chars`, from the tokenizer's bound on characters per
token, `prompt_chars.py`) is refused by its length before it is tokenized:
tokenizing a 1 MiB prompt only to refuse it took most of a second each, and
eight of them held a 2-token request for 4.9 s. Chat messages are rendered
first (a template may drop or add text), then checked the same way.

Tokenization (and chat-template rendering) runs on a pool of
`TOKENIZER_THREADS` worker threads, with the server's own tokenizer (the
engine thread has its own): never on the event loop, and a long prompt being
tokenized does not queue every short one behind it. The event loop itself
only decodes with the same tokenizer (logprobs). A fast tokenizer fails
across threads only when one of them mutates it (truncation, padding, added
tokens); encode without truncation or padding and decode only read it.

`Serving.submit(plan)` checks the waiting-queue limit (`admission.py`: 503
to retry later, 400 when the request alone exceeds it) and adds the plan's
prompts to the engine loop, all without awaiting, so concurrent requests on
the event loop are counted one after another and cannot all pass the check
before any of them is queued. It returns a `Submission`.

`Serving.outputs(submission)` yields, each time the engine has delivered
something, everything delivered since the last time: a batch of
`(prompt_index, RequestOutput)`. A stream writes each batch as one body
chunk, so a request with many prompts (or n) costs one socket write per
event-loop turn, not one per choice: once a client has reset its connection,
asyncio drops every write until it reports the loss on the next turn, and
logged "socket.send() raised exception." for each one from the fifth on.
Whatever ends the consumer (the client went away: starlette cancels the
stream, or `watch_disconnect` for non-streaming; an error; shutdown),
`Submission.abort_unfinished` runs and the engine frees the blocks of every
prompt that has not finished at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from pagedinfer.contracts import chat_template
from pagedinfer.contracts.http.disconnect import watch_disconnect
from pagedinfer.contracts.http.errors import ApiError, from_value_error
from pagedinfer.engine.outputs import OutputAccumulator
from pagedinfer.engine.server import request_options
from pagedinfer.engine.server.admission import check_waiting_limit
from pagedinfer.engine.server.beam_request import (
    beam_search_params,
    check_beam_fits,
    check_beam_options,
    check_not_beam_fields,
)
from pagedinfer.engine.server.completion_shape import CompletionShape
from pagedinfer.engine.server.engine_loop import EngineLoop, RequestFailed, RequestSink
from pagedinfer.engine.server.protocol import ChatCompletionRequest, CompletionRequest

RETRY_AFTER_SECONDS = 1
TOKENIZER_THREADS = 4  # prompts tokenized at once; more wait for a thread

T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    """One HTTP request, ready for the engine."""

    request_id: str
    created: int
    model: str
    prompts: list[list[int]]
    params: Any  # SamplingParams
    num_logprobs: int | None  # top-k logprobs to report, None when not requested
    stream: bool
    include_usage: bool
    arrival_time: float
    completion: CompletionShape = field(default_factory=CompletionShape)  # echo, best_of, prompt_logprobs
    tools: Any = None  # chat: a tools.choice.ToolPlan when tool calls are to be returned


class Submission:
    """A plan whose prompts were added to the engine loop, and which of them are still unfinished.

    Invariant: every id in `unfinished` was added and has neither finished
    nor been aborted. `abort_unfinished` is idempotent.
    """

    def __init__(self, plan: Plan, engine_loop: EngineLoop, sink: RequestSink) -> None:
        self.plan = plan
        self.sink = sink
        self._engine_loop = engine_loop
        self.request_ids = [f"{plan.request_id}-{i}" for i in range(len(plan.prompts))]
        self.index_of = {request_id: i for i, request_id in enumerate(self.request_ids)}
        self.unfinished = set(self.request_ids)

    def abort_unfinished(self) -> None:
        for request_id in self.unfinished:
            self._engine_loop.abort(request_id)
        self.unfinished.clear()


class ClientDisconnected(Exception):
    """The HTTP client went away before its response was complete."""


class Serving:
    def __init__(self, engine_loop: EngineLoop, max_waiting_requests: int | None) -> None:
        self.engine_loop = engine_loop
        self.max_waiting_requests = max_waiting_requests
        self._tokenizer_threads = ThreadPoolExecutor(
            max_workers=TOKENIZER_THREADS, thread_name_prefix="pagedinfer-tokenize"
        )

    def close(self) -> None:
        self._tokenizer_threads.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_threads, work)

    # ---- admission and validation ----
    def _admit(self, model: str) -> Any:
        loop = self.engine_loop
        if loop.load_error is not None or loop.engine_error is not None:
            raise ApiError(
                503,
                "the engine is not available",
                code="engine_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        if not loop.ready.is_set() or loop.info is None:
            raise ApiError(
                503,
                "the model is still loading",
                code="model_loading",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        if not loop.accepting:
            raise ApiError(
                503,
                "the server is shutting down",
                code="shutting_down",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        info = loop.info
        if model != info.served_model_name:
            raise ApiError(
                404,
                f"model: '{model}' does not exist; this server serves '{info.served_model_name}'",
                param="model",
                code="model_not_found",
            )
        return info

    @staticmethod
    def _check_n(info: Any, n: int) -> None:
        if n > info.max_num_seqs:
            raise ApiError(
                400,
                f"n: {n} completions exceed this server's max_num_seqs ({info.max_num_seqs})",
                param="n",
                code="invalid_parameter",
            )

    def _check_lengths(
        self,
        info: Any,
        prompts: list[list[int]],
        max_tokens: int | None,
        param: str,
        max_tokens_param: str = "max_tokens",
    ) -> int:
        """The max_tokens to use; 400 when a prompt plus it cannot fit max_model_len."""
        longest = max(len(p) for p in prompts)
        if longest >= info.max_model_len:
            raise ApiError(
                400,
                f"{param}: {longest} tokens, but max_model_len is {info.max_model_len} "
                f"(prompt plus at least one generated token must fit)",
                param=param,
                code="context_length_exceeded",
            )
        if max_tokens is None:
            return info.max_model_len - longest
        if longest + max_tokens > info.max_model_len:
            raise ApiError(
                400,
                f"{max_tokens_param}: prompt ({longest} tokens) + {max_tokens_param} "
                f"({max_tokens}) = {longest + max_tokens} exceeds max_model_len "
                f"({info.max_model_len})",
                param=max_tokens_param,
                code="context_length_exceeded",
            )
        return max_tokens

    def _sampling_params(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        max_tokens: int,
        num_logprobs: int | None,
        extra: dict[str, Any] | None = None,
    ) -> Any:
        from pagedinfer.engine import SamplingParams

        if req.use_beam_search:
            check_beam_options(req, extra or {})
            return beam_search_params(req, max_tokens)
        check_not_beam_fields(req)
        fields: dict[str, Any] = dict(
            n=req.n,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            stop=req.stop,
            logprobs=num_logprobs,
        )
        fields.update(extra or {})
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            value = getattr(req, name)
            if value is not None:
                fields[name] = value
        try:
            return SamplingParams(**fields)
        except ValueError as exc:
            raise from_value_error(exc) from None

    @staticmethod
    def _check_chars(info: Any, text: str, param: str) -> None:
        """400 when text is too long for max_model_len tokens whatever it tokenizes to (no tokenizing)."""
        limit = info.max_prompt_chars
        if limit is not None and len(text) > limit:
            raise ApiError(
                400,
                f"{param}: {len(text)} characters, more than max_model_len ({info.max_model_len}) "
                f"tokens can hold with this tokenizer (at most {limit} characters)",
                param=param,
                code="context_length_exceeded",
            )

    @staticmethod
    def _tokenize(info: Any, prompt: str | list[int], param: str, add_special_tokens: bool) -> list[int]:
        """The prompt's token ids, each below info.num_token_ids (worker thread)."""
        if isinstance(prompt, str):
            Serving._check_chars(info, prompt, param)
            _check_unicode(prompt, param)
            token_ids = info.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            token_ids = list(prompt)
        if not token_ids:
            raise ApiError(400, f"{param}: must not be empty", param=param, code="invalid_parameter")
        limit = info.num_token_ids
        bad = next((t for t in token_ids if t >= limit), None)
        if bad is not None:
            what = "the text tokenizes to token id" if isinstance(prompt, str) else "token id"
            raise ApiError(
                400,
                f"{param}: {what} {bad}, outside the model's vocabulary (ids 0-{limit - 1})",
                param=param,
                code="invalid_parameter",
            )
        return token_ids

    @staticmethod
    def _render_chat(info: Any, req: ChatCompletionRequest, add_generation_prompt: bool = True) -> str:
        """The messages through the chat template (worker thread); the tools too unless tool_choice is "none"."""
        messages = []
        for i, m in enumerate(req.messages):
            text = chat_template.message_text(
                m.role, m.content if not isinstance(m.content, list) else [p.text for p in m.content]
            )
            if text is None:
                raise ApiError(
                    400,
                    f"messages.{i}.content: may be null only for role 'assistant'",
                    param=f"messages.{i}.content",
                    code="invalid_parameter",
                )
            _check_unicode(text, f"messages.{i}.content")
            tool_calls = [c.model_dump() for c in m.tool_calls] if m.tool_calls else None
            messages.append(chat_template.template_message(m.role, text, tool_calls, m.tool_call_id, m.name))
        tools = getattr(req, "tools", None)
        tools = [t.model_dump(exclude_none=True) for t in tools] if tools else None
        try:
            return info.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **chat_template.template_tools(tools, req.effective_tool_choice()),
            )
        except Exception as exc:  # noqa: BLE001 - template errors are about the messages
            raise ApiError(
                400, f"messages: the chat template rejected them: {exc}", param="messages", code="invalid_parameter"
            ) from None

    # ---- for /tokenize and /detokenize (tokenize_routes.py) ----
    def admit_model(self, model: str | None) -> Any:
        """The engine's info when it serves requests; `model`, when given, must be the served name."""
        loop = self.engine_loop
        return self._admit(loop.info.served_model_name if model is None and loop.info is not None else model)

    render_chat = _render_chat
    tokenize_text = _tokenize
    off_loop = _off_loop

    async def prepare_completion(self, req: CompletionRequest) -> Plan:
        info = self._admit(req.model)
        self._check_n(info, req.n)
        self._check_waiting_limit(len(req.prompts()), req.n)  # shed load before tokenizing; submit decides
        for prompt in req.prompts():
            if isinstance(prompt, str):
                self._check_chars(info, prompt, "prompt")  # on the loop: refused without queueing for a thread
        prompts = await self._off_loop(
            lambda: [self._tokenize(info, p, "prompt", add_special_tokens=True) for p in req.prompts()]
        )
        shape = CompletionShape.of(req, [p if isinstance(p, str) else None for p in req.prompts()])
        options = request_options.completion_options(info, req, shape)
        max_tokens = self._check_lengths(info, prompts, shape.engine_max_tokens(req.max_tokens), "prompt")
        params = self._sampling_params(req, max_tokens, shape.engine_logprobs(req.logprobs), options)
        await self._compile_constraint(info, params)
        return dataclasses.replace(self._plan("cmpl", info, prompts, params, req.logprobs, req), completion=shape)

    async def prepare_chat(self, req: ChatCompletionRequest) -> Plan:
        info = self._admit(req.model)
        self._check_n(info, req.n)
        self._check_waiting_limit(1, req.n)  # shed load before rendering and tokenizing; submit decides
        prompts = await self._off_loop(
            lambda: [self._tokenize(info, self._render_chat(info, req), "messages", add_special_tokens=False)]
        )
        requested, max_tokens_param = req.requested_max_tokens()
        max_tokens = self._check_lengths(info, prompts, requested, "messages", max_tokens_param)
        num_logprobs = (req.top_logprobs or 0) if req.logprobs else None
        options, tools = request_options.chat_options(info, req)
        params = self._sampling_params(req, max_tokens, num_logprobs, options)
        await self._compile_constraint(info, params)
        return dataclasses.replace(self._plan("chatcmpl", info, prompts, params, num_logprobs, req), tools=tools)

    async def _compile_constraint(self, info: Any, params: Any) -> None:
        """Compile the request's output constraint off the loop (a beam search has none: check_beam_options)."""
        spec = getattr(params, "structured_outputs", None)
        await self._off_loop(lambda: request_options.compile_structured(info, spec))

    @staticmethod
    def _plan(
        kind: str,
        info: Any,
        prompts: list[list[int]],
        params: Any,
        num_logprobs: int | None,
        req: CompletionRequest | ChatCompletionRequest,
    ) -> Plan:
        if req.use_beam_search:
            check_beam_fits(info, prompts, params)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return Plan(
            request_id=f"{kind}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=info.served_model_name,
            prompts=prompts,
            params=params,
            num_logprobs=num_logprobs,
            stream=req.stream,
            include_usage=include_usage,
            arrival_time=time.monotonic(),
        )

    # ---- running ----
    def _check_waiting_limit(self, num_prompts: int, n: int) -> None:
        refusal = check_waiting_limit(
            self.engine_loop.num_waiting_sequences(), num_prompts, n, self.max_waiting_requests
        )
        if refusal is not None and refusal.status_code == 503:
            raise ApiError(
                503, refusal.message, code="server_overloaded", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            )
        if refusal is not None:
            raise ApiError(refusal.status_code, refusal.message, param=refusal.param, code="invalid_parameter")

    def submit(self, plan: Plan) -> Submission:
        """Admit the plan under the waiting-queue limit and add its prompts to the engine loop (no await).

        An asleep engine refuses it first: 503 `asleep`, before a stream's headers (a router wakes the engine)."""
        if self.engine_loop.sleeping:
            raise ApiError(
                503,
                "the engine is asleep; POST /wake_up wakes it",
                code="asleep",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        self._check_waiting_limit(len(plan.prompts), plan.params.n)
        submission = Submission(plan, self.engine_loop, RequestSink(asyncio.get_running_loop()))
        for request_id, prompt in zip(submission.request_ids, plan.prompts):
            self.engine_loop.add(request_id, prompt, plan.params, plan.arrival_time, submission.sink)
        return submission

    async def outputs(self, submission: Submission) -> AsyncIterator[list[tuple[int, Any]]]:
        """Yield batches of (prompt index, RequestOutput), all that is queued, until every prompt finished.

        The engine sends deltas (only what each step added); they are applied
        here, in place, to one RequestOutput per prompt, so a yielded output
        grows until it is finished (a consumer keeps only finished ones). A
        failure is raised after the batch of outputs queued before it; the
        unfinished prompts are aborted however the consumer stops.
        """
        queue = submission.sink.queue
        accumulator = OutputAccumulator()
        try:
            while submission.unfinished:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                batch, failure = [], None
                for item in items:
                    if isinstance(item, RequestFailed):
                        failure = item
                        break
                    output = accumulator.add(item)
                    if output.finished:
                        submission.unfinished.discard(output.request_id)
                    batch.append((submission.index_of[output.request_id], output))
                if batch:
                    yield batch
                if failure is not None:
                    raise failure
        finally:
            submission.abort_unfinished()

    async def final_outputs(self, submission: Submission, request: Request) -> list[Any]:
        """The finished output of every prompt; aborts them if the client disconnects first."""
        finals: list[Any] = [None] * len(submission.plan.prompts)
        stream = self.outputs(submission)
        disconnect = asyncio.ensure_future(watch_disconnect(request))
        try:
            while True:
                step = asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({step, disconnect}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                    raise ClientDisconnected()
                try:
                    batch = step.result()
                except StopAsyncIteration:
                    return finals
                for index, output in batch:
                    if output.finished:
                        finals[index] = output
        finally:
            disconnect.cancel()
            await stream.aclose()
            submission.abort_unfinished()  # also when the stream never started


def _check_unicode(text: str, param: str) -> None:
    """400 unless text encodes to UTF-8 (JSON escapes can carry lone surrogates that no tokenizer takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(
            400,
            f"{param}: not valid Unicode: lone surrogate \\u{ord(text[exc.start]):04x} at character {exc.start}",
            param=param,
            code="invalid_parameter",
        ) from None
