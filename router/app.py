"""The router's HTTP front: OpenAI's routes, each request proxied to one engine.

A completion is tokenized as the engine will tokenize it, hashed into the
engine's block hashes, and handed to `policy.pick` with a snapshot of the
engines' state; the chosen engine's answer is passed through as it arrives
(a stream is never buffered). Every proxied response carries
`x-pagedinfer-route: engine=URL; matched_tokens=N; reason=R`.

Faults (`upstream.py` has the rule and the bounds): a request that has
received no byte from its engine is tried once more elsewhere: a refused
connection (which also drops the engine at once), a 503, a stream's headers
missing the first-byte bound, or an engine dropped while the request waited
on it. A stream that breaks after its first byte, or whose engine is dropped,
ends with the `upstream_broken` error event and [DONE]; a non-streamed answer
whose body breaks is a 502.

No engine ready (none discovered, all asleep or loading, or every one tried
refused the request as asleep): the request is held (`hold/`) in a bounded
FIFO queue until an engine is ready, then sent on; meanwhile the router
wakes an asleep engine, else signals demand to the operator. A full queue
or a request past its deadline gets 503 with Retry-After and the reason;
a held stream gets SSE keep-alive comments (`hold/waiting.py`). An engine
that answers 503 for another reason (draining) is passed on as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from pagedinfer.contracts import validators
from pagedinfer.contracts.http.auth import ApiKeyMiddleware
from pagedinfer.contracts.http.body_limit import BodySizeLimitMiddleware
from pagedinfer.contracts.http.errors import error_body, error_response
from pagedinfer.contracts.http.read_timeouts import DEFAULT_BODY_TIMEOUT_SECONDS
from pagedinfer.router import upstream as bounds
from pagedinfer.router.discovery import DiscoverySettings, follow_endpoint_slices
from pagedinfer.router.engine_tokenizer import RouterTokenizer
from pagedinfer.router.hashing import prefix_block_hashes
from pagedinfer.router.hold.capacity import Capacity
from pagedinfer.router.hold.demand import DemandSignal, DemandTarget
from pagedinfer.router.hold.queue import HoldQueue, HoldSettings, QueueFull
from pagedinfer.router.hold.waiting import CLOSED, EXPIRED, GONE, KEEPALIVE, READY, held_stream, sse, wait_for_engine
from pagedinfer.router.metrics import RouterMetrics
from pagedinfer.router.policy import Decision, pick
from pagedinfer.router.state import ASLEEP_STATUS, RouterState
from pagedinfer.router.upstream import DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS, EngineLost, unless_lost
from pagedinfer.router.warmup.coordinator import WarmupCoordinator
from pagedinfer.router.warmup.gate import ReadinessGate
from pagedinfer.router.warmup.replay import Warmer
from pagedinfer.router.warmup.settings import WarmupSettings

logger = logging.getLogger("pagedinfer.router")

ROUTE_HEADER = "x-pagedinfer-route"
RETRY_AFTER_SECONDS = 1
CLIENT_CLOSED_REQUEST = 499  # nginx's code; never seen by the client (it left while held), only in logs
DEFAULT_BLOCK_SIZE = 16  # until an engine's discovery says otherwise
MAX_ATTEMPTS = 2
UPSTREAM_TIMEOUT = httpx.Timeout(
    connect=bounds.UPSTREAM_CONNECT_TIMEOUT_SECONDS,
    read=bounds.UPSTREAM_READ_TIMEOUT_SECONDS,
    write=bounds.UPSTREAM_WRITE_TIMEOUT_SECONDS,
    pool=bounds.UPSTREAM_POOL_TIMEOUT_SECONDS,
)
FORWARDED_HEADERS = ("authorization", "content-type", "accept")


@dataclass(frozen=True)
class RouterSettings:
    engines: tuple[str, ...]
    policy: str = "prefix"
    api_key: str | None = None
    tokenizer_dir: str | None = None  # None: the engines' own, fetched (the embedded model's until then)
    discovery: DiscoverySettings | None = None  # follow a Service's ready endpoints instead of `engines`
    max_request_body_bytes: int = 1 << 20  # 413 above this, as the engine's server
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS  # the whole body, counted from its headers: else 408
    first_byte_timeout_seconds: float = DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS  # a stream's headers, else retried
    hold: HoldSettings = HoldSettings()  # the queue of requests waiting for an engine
    demand: DemandTarget | None = None  # the InferenceService to annotate with demand; None: no signal
    warmup: WarmupSettings = WarmupSettings()  # replays of hot prefixes to new engines and on hand-off

    def __post_init__(self) -> None:
        validators.positive_seconds("first_byte_timeout_seconds", self.first_byte_timeout_seconds)


def route_header(decision: Decision | None, reason: str = "no-engine") -> str:
    if decision is None:
        return f"engine=none; matched_tokens=0; reason={reason}"
    return f"engine={decision.engine}; matched_tokens={decision.matched_tokens}; reason={decision.reason}"


def create_router_app(settings: RouterSettings) -> FastAPI:
    from pagedinfer.contracts.embedded_model import default_model_dir

    tokenizer = RouterTokenizer(settings.tokenizer_dir, str(default_model_dir()), settings.api_key)
    tokenize_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-tokenize")
    turns = itertools.count()
    holder: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        client = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT, limits=httpx.Limits(max_connections=1000))
        hold = HoldQueue(settings.hold)
        admin = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        readiness_gate = settings.discovery is not None and settings.discovery.readiness_gate
        gate = ReadinessGate(settings.discovery) if readiness_gate else None
        warmup = WarmupCoordinator(
            settings.warmup,
            Warmer(client, admin, lambda e, n: holder["metrics"].warmup_tokens.labels(e).inc(n)),
            lambda url: state.engines[url].view() if url in state.engines else None,
        )
        state = RouterState(
            list(settings.engines),
            client,
            on_discovery=lambda url, info: tokenizer.offer(client, url, info.tokenizer_sha256),
            on_routable=hold.release,
            admin_headers=admin,
            on_new_engine=warmup.warm_new_engine if settings.warmup.enabled else None,
            on_leaving=warmup.hand_off,
            open_gate=gate.open if gate is not None else None,
        )
        demand = DemandSignal(settings.demand) if settings.demand is not None else None
        capacity = Capacity(
            hold, lambda: bool(state.views()), lambda: _wake_order(state, settings.policy), state.wake, demand
        )
        holder.update(
            client=client, state=state, warmup=warmup, metrics=RouterMetrics(state, hold), hold=hold, capacity=capacity
        )
        app.state.tokenizer = tokenizer
        app.state.router = state
        app.state.hold = hold
        app.state.loop = asyncio.get_running_loop()
        app.state.capacity = capacity
        state.start()
        tasks = [asyncio.create_task(capacity.run())]
        if settings.discovery is not None:
            tasks.append(asyncio.create_task(follow_endpoint_slices(settings.discovery, state.set_engines)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await warmup.stop()
            await state.stop()
            await client.aclose()
            if demand is not None:
                await demand.aclose()
            if gate is not None:
                await gate.aclose()
            tokenize_thread.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="pagedinfer router", lifespan=lifespan)

    def unavailable(message: str, code: str = "no_engine", reason: str = "no-engine") -> Response:
        response = error_response(503, message, code=code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        response.headers[ROUTE_HEADER] = route_header(None, reason)
        return response

    @app.get("/health")
    async def health() -> Response:
        """200 while the router can take requests: an engine is ready ("ok"), or none is and the hold queue
        has room ("holding": requests wait for one); 503 only with the queue full."""
        hold: HoldQueue = holder["hold"]
        if holder["state"].views():
            return JSONResponse({"status": "ok"})
        if len(hold) < hold.settings.max_length:
            return JSONResponse({"status": "holding", "queued": len(hold)})
        return unavailable("no engine is ready and the hold queue is full", "queue_full", "queue-full")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(holder["metrics"].render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        state: RouterState = holder["state"]
        for view in state.views():
            try:
                r = await holder["client"].get(view.name + "/v1/models", headers=_forwarded(request))
            except httpx.HTTPError as exc:
                state.mark_dead(view.name, type(exc).__name__)
                continue
            return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        return unavailable("no engine is healthy")

    def expired_message() -> str:
        waited = holder["hold"].settings.timeout_seconds
        return f"no engine became ready: waited {waited:g} s in the router's queue; {holder['capacity'].problem()}"

    def held_error(outcome: str) -> tuple[str, str]:
        """(message, code) of a held request that got no engine."""
        if outcome == CLOSED:
            return "the router is shutting down; retry the request", "shutting_down"
        return expired_message(), "no_engine"

    def held_event(outcome: str) -> bytes:
        """A held stream's end without an engine: the error event, then [DONE]."""
        message, code = held_error(outcome)
        return sse(error_body(503, message, code=code)) + sse("[DONE]")

    async def held(
        request: Request | None,
        headers: dict[str, str],
        raw: bytes,
        ids,
        path: str,
        stream: bool,
        ticket,
        at_most_seconds: float | None,
    ) -> Any:
        """Wait for an engine, then forward; the Response, or EXPIRED / GONE / KEEPALIVE. request: whose
        disconnect ends the wait (None once its response streams: starlette cancels it then)."""
        state: RouterState = holder["state"]
        while True:
            outcome = await wait_for_engine(
                holder["hold"], ticket, lambda: bool(state.views()), request, at_most_seconds
            )
            if outcome != READY:
                return outcome
            response = await forward(headers, raw, ids, path, stream)
            if response is not None:
                return response

    async def proxy(request: Request, path: str, chat: bool) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            response = error_response(400, "the body must be a JSON object", code="invalid_json")
            response.headers[ROUTE_HEADER] = route_header(None, "invalid-request")
            return response
        ids = await asyncio.get_running_loop().run_in_executor(
            tokenize_thread, tokenizer.current.prompt_ids, body, chat
        )
        stream = body.get("stream") is True
        holder["warmup"].observe(body.get("model"), ids, holder["state"].block_size or DEFAULT_BLOCK_SIZE)
        headers = _forwarded(request)
        if holder["state"].views():
            response = await forward(headers, raw, ids, path, stream)
            if response is not None:
                return response
        hold: HoldQueue = holder["hold"]
        try:
            ticket = hold.enter()
        except QueueFull as exc:
            if hold.closed:
                return unavailable(*held_error(CLOSED))
            return unavailable(f"{exc}; retry later", "queue_full", "queue-full")
        keepalive = hold.settings.keepalive_seconds if stream else None
        try:
            outcome = await held(request, headers, raw, ids, path, stream, ticket, keepalive)
        except BaseException:
            hold.leave(ticket)
            raise
        if outcome != KEEPALIVE:
            hold.leave(ticket)
        if outcome == GONE:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        if outcome in (EXPIRED, CLOSED):
            return unavailable(*held_error(outcome))
        if outcome != KEEPALIVE:
            return outcome
        # a stream still waiting: its headers now, then keep-alives until its engine's answer or its deadline
        body_iterator = held_stream(
            lambda: held(None, headers, raw, ids, path, stream, ticket, keepalive),
            held_event,
            lambda: hold.leave(ticket),
        )
        return StreamingResponse(
            body_iterator, 200, {ROUTE_HEADER: route_header(None, "held")}, media_type="text/event-stream"
        )

    async def forward(headers_in: dict[str, str], raw: bytes, ids, path: str, stream: bool) -> Response | None:
        """Send the request to the best engine (once more elsewhere if nothing came back); None if no engine
        could take it and none refused it for a reason of its own (every one is gone or asleep: hold it)."""
        state: RouterState = holder["state"]
        client: httpx.AsyncClient = holder["client"]
        metrics: RouterMetrics = holder["metrics"]
        first_byte_timeout = settings.first_byte_timeout_seconds if stream else None
        tried: set[str] = set()
        refused: Response | None = None
        for _ in range(MAX_ATTEMPTS):
            views = [v for v in state.views() if v.name not in tried]
            if not views:
                break
            block_size = state.block_size or DEFAULT_BLOCK_SIZE
            hashes = prefix_block_hashes(ids, block_size) if ids else []
            key = hashes[0] if hashes else json.dumps(ids).encode()
            decision = pick(settings.policy, views, hashes, block_size, key, next(turns))
            engine = state.engines[decision.engine]
            tried.add(decision.engine)
            engine.num_inflight += 1
            lost = engine.lost
            sent = client.send(
                client.build_request("POST", decision.engine + path, content=raw, headers=headers_in), stream=True
            )
            try:
                upstream = await unless_lost(sent, lost, first_byte_timeout, "first byte")
            except EngineLost as exc:
                engine.num_inflight -= 1
                logger.warning(
                    "request to %s given up before its first byte, tried elsewhere: %s", decision.engine, exc
                )
                metrics.retries.inc()
                continue
            except httpx.TransportError as exc:
                engine.num_inflight -= 1
                state.mark_dead(decision.engine, type(exc).__name__)
                metrics.retries.inc()
                continue
            except BaseException:  # cancelled: a held stream whose client left while it was being sent
                engine.num_inflight -= 1
                raise
            if upstream.status_code == 503:
                content = await upstream.aread()
                if _error_code(content) == ASLEEP_STATUS:  # asleep: not a refusal; hold it if none is awake
                    await upstream.aclose()
                    engine.num_inflight -= 1
                    state.mark_asleep(decision.engine)
                    continue
                refused = Response(
                    content,
                    503,
                    media_type=upstream.headers.get("content-type"),
                    headers={
                        "Retry-After": upstream.headers.get("retry-after", str(RETRY_AFTER_SECONDS)),
                        ROUTE_HEADER: route_header(decision),
                    },
                )
                await upstream.aclose()
                engine.num_inflight -= 1
                metrics.retries.inc()
                continue
            metrics.decisions.labels(decision.reason, decision.engine).inc()
            metrics.matched_tokens.inc(decision.matched_tokens)
            headers = {ROUTE_HEADER: route_header(decision)}
            media_type = upstream.headers.get("content-type", "application/json")
            if media_type.startswith("text/event-stream"):
                return StreamingResponse(
                    _passthrough(upstream, engine, lost), upstream.status_code, headers, media_type=media_type
                )
            try:  # the status line has arrived: the engine ran the request, which is never run twice
                content = await unless_lost(upstream.aread(), lost, None, "whole body")
            except (httpx.HTTPError, EngineLost) as exc:
                if isinstance(exc, httpx.HTTPError):
                    state.mark_dead(decision.engine, type(exc).__name__)
                response = error_response(502, f"the engine's answer broke: {exc}", code="upstream_broken")
                response.headers[ROUTE_HEADER] = route_header(decision)
                return response
            finally:
                await upstream.aclose()
                engine.num_inflight -= 1
            return Response(content, upstream.status_code, headers, media_type=media_type)
        if refused is not None:
            return refused
        return unavailable("no engine could take the request") if state.views() else None

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy(request, "/v1/chat/completions", chat=True)

    app.add_middleware(
        BodySizeLimitMiddleware,
        max_body_bytes=settings.max_request_body_bytes,
        body_timeout_seconds=settings.body_timeout_seconds,
    )
    app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    return app


def _wake_order(state: RouterState, policy: str) -> list[str]:
    """The asleep engines, the one the policy would pick first (they hold no cache: by load, or the ring)."""
    views = state.asleep_views()
    if not views:
        return []
    first = pick(policy, views, [], state.block_size or DEFAULT_BLOCK_SIZE, b"wake", 0).engine
    return [first] + [v.name for v in views if v.name != first]


def _error_code(content: bytes) -> str | None:
    try:
        error = json.loads(content).get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def _forwarded(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}


def _sse(payload: Any) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


async def _passthrough(upstream: httpx.Response, engine, lost: asyncio.Event) -> Any:
    """The engine's bytes as they arrive; a break, or the engine dropped (`lost`), ends the stream with an
    error event and [DONE]."""
    chunks = upstream.aiter_raw()
    try:
        while True:
            try:
                chunk = await unless_lost(anext(chunks), lost, None, "next chunk")
            except StopAsyncIteration:
                break
            yield chunk
    except (httpx.HTTPError, EngineLost) as exc:
        why = type(exc).__name__ if isinstance(exc, httpx.HTTPError) else str(exc)
        yield _sse(error_body(502, f"the engine's stream broke: {why}", code="upstream_broken"))
        yield _sse("[DONE]")
    finally:
        await upstream.aclose()
        engine.num_inflight -= 1
