"""The FastAPI application: routes, middleware, lifespan.

`create_app(engine_loop, metrics, settings)` wires the parts; it does not
load anything itself. The lifespan starts the engine loop (which loads the
model on its own thread, so /health answers 503 until the KV pool exists)
and stops it on shutdown. Middleware order, outermost first: API key (401
before any body is read), body size limit (413), then FastAPI.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from pagedinfer.contracts import validators
from pagedinfer.contracts.config.options import field_default
from pagedinfer.contracts.config.serve_args import DEFAULT_MAX_WAITING_REQUESTS, ServeArgs
from pagedinfer.contracts.http.auth import ApiKeyMiddleware
from pagedinfer.contracts.http.body_limit import BodySizeLimitMiddleware
from pagedinfer.contracts.http.errors import ApiError, error_body, error_response, install_error_handlers
from pagedinfer.contracts.http.read_timeouts import DEFAULT_BODY_TIMEOUT_SECONDS
from pagedinfer.contracts.http.warmup_requests import as_warmup, is_warmup
from pagedinfer.contracts.kv_events.tokenizer_files import TOKENIZER_PATH
from pagedinfer.engine.kv_events.routes import install_kv_event_routes
from pagedinfer.engine.server.engine_loop import EngineLoop, RequestFailed
from pagedinfer.engine.server.metrics import ServerMetrics
from pagedinfer.engine.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from pagedinfer.engine.server.responses import DeltaTracker, chat_response, completion_response, sse
from pagedinfer.engine.server.serving import RETRY_AFTER_SECONDS, ClientDisconnected, Serving, Submission
from pagedinfer.engine.server.sleep_routes import SLEEP_PATHS, install_sleep_routes
from pagedinfer.engine.server.tokenize_routes import install_tokenize_routes

CLIENT_CLOSED_REQUEST = 499  # nginx's code; never seen by the client, only in access logs


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    max_waiting_requests: int | None = DEFAULT_MAX_WAITING_REQUESTS  # None: no limit
    max_request_body_bytes: int = field_default(ServeArgs, "max_request_body_bytes")  # --max-request-body-bytes
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS  # the whole body, counted from its headers

    def __post_init__(self) -> None:
        validators.positive_int("max_waiting_requests", self.max_waiting_requests, allow_none=True)
        validators.positive_int("max_request_body_bytes", self.max_request_body_bytes)
        validators.positive_seconds("body_timeout_seconds", self.body_timeout_seconds)


class AbortingStreamingResponse(StreamingResponse):
    """Aborts its submission's unfinished prompts however the response ends (done, client gone, shutdown).

    starlette leaves an abandoned generator suspended until garbage
    collection; closing it runs its `finally`, and `abort_unfinished` covers a
    generator that never started. The engine frees their KV blocks at once.
    """

    def __init__(self, content: Any, submission: Submission) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.submission = submission

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            self.submission.abort_unfinished()


_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 408, 413, 415, 503)}


def require_json_body(request: Request) -> None:
    """415 unless the request declares a JSON body (application/json or application/*+json).

    FastAPI parses only such bodies as JSON. Refusing the rest, rather than
    parsing them anyway, also refuses what a browser may send cross-site
    without a CORS preflight (text/plain, forms, no Content-Type).
    """
    content_type = request.headers.get("content-type")
    media_type = (content_type or "").partition(";")[0].strip().lower()
    if media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json")):
        return
    got = f"got {content_type!r}" if content_type is not None else "none was sent"
    raise ApiError(415, f"Content-Type: must be application/json ({got})", code="unsupported_media_type")


def create_app(
    engine_loop: EngineLoop, metrics: ServerMetrics, settings: ServerSettings, kv_events: Any = None
) -> FastAPI:
    """kv_events: the started KVEventPublisher (`--kv-events`), or None; closed with the app."""
    serving = Serving(engine_loop, settings.max_waiting_requests)
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        engine_loop.start()
        try:
            yield
        finally:
            engine_loop.stop()
            serving.close()
            if kv_events is not None:
                kv_events.close()

    app = FastAPI(title="pagedinfer", version=_version(), lifespan=lifespan)
    install_error_handlers(app)
    install_kv_event_routes(app, kv_events, lambda: engine_loop.info.tokenizer if engine_loop.info else None)

    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> Response:
        if engine_loop.healthy:
            return JSONResponse({"status": "asleep" if engine_loop.sleeping else "ok"})
        reason = "loading" if not engine_loop.ready.is_set() else "unavailable"
        return error_response(503, f"not ready: {reason}", code="not_ready", headers={"Retry-After": "1"})

    @app.get("/version")
    async def version() -> dict:
        return {"version": _version()}

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        info = engine_loop.info
        if info is None:
            raise ApiError(503, "the model is still loading", code="model_loading", headers={"Retry-After": "1"})
        return {
            "id": info.served_model_name,
            "object": "model",
            "created": started,
            "owned_by": "pagedinfer",
            "max_model_len": info.max_model_len,
        }

    @app.get("/v1/models", response_model=ModelList, responses=_ERRORS)
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    # `:path`: a Hub id served under its own name has a slash (org/name), as the client sends it
    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=_ERRORS)
    async def model(model_id: str) -> dict:
        card = model_card()
        if model_id != card["id"]:
            raise ApiError(
                404,
                f"model: '{model_id}' does not exist; this server serves '{card['id']}'",
                "model",
                "model_not_found",
            )
        return card

    async def respond(plan: Any, request: Request, chat: bool) -> Response:
        """Submit a prepared request; stream it, or wait for its final outputs."""
        submission = serving.submit(plan)
        if plan.stream:
            return AbortingStreamingResponse(_stream(serving, submission, chat=chat), submission)
        finals = await _finals(serving, submission, request)
        if finals is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        build = chat_response if chat else completion_response
        return JSONResponse(build(plan, finals, engine_loop.info.tokenizer))

    json_only = [Depends(require_json_body)]

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_ERRORS, dependencies=json_only)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        plan = await serving.prepare_completion(body)
        return await respond(as_warmup(plan) if is_warmup(request.headers) else plan, request, chat=False)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_ERRORS, dependencies=json_only)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await respond(await serving.prepare_chat(body), request, chat=True)

    install_tokenize_routes(app, serving, json_only)
    install_sleep_routes(app, engine_loop)
    metrics.watch_sleeping(lambda: engine_loop.sleeping)

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi_with_model_name(app, metrics.model_name)
        return app.openapi_schema

    app.openapi = openapi
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_body_bytes=settings.max_request_body_bytes,
        body_timeout_seconds=settings.body_timeout_seconds,
    )
    described_at = tuple(url for url in (app.openapi_url, app.docs_url, app.redoc_url) if url)
    app.add_middleware(
        ApiKeyMiddleware,
        api_key=settings.api_key,
        protected_prefixes=("/v1", TOKENIZER_PATH, *SLEEP_PATHS, *described_at),
    )
    return app


def _openapi_with_model_name(app: FastAPI, model_name: str) -> dict:
    """The generated schema, with `model` restricted to the one name this server answers to."""
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        properties = schema.get("components", {}).get("schemas", {}).get(name, {}).get("properties", {})
        if "model" in properties:
            properties["model"] = {"type": "string", "enum": [model_name], "title": "Model"}
    return schema


async def _finals(serving: Serving, submission: Submission, request: Request) -> list[Any] | None:
    try:
        return await serving.final_outputs(submission, request)
    except RequestFailed as exc:
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status_code == 503 else None
        raise ApiError(exc.status_code, exc.message, exc.param, exc.code, retry) from None
    except ClientDisconnected:
        return None


async def _stream(serving: Serving, submission: Submission, chat: bool):
    """The SSE body, one write per batch of engine outputs (see `Serving.outputs`)."""
    plan = submission.plan
    tracker = DeltaTracker(plan, serving.engine_loop.info.tokenizer, chat)
    opening = "".join(tracker.opening_chunks())
    if opening:
        yield opening
    try:
        async for batch in serving.outputs(submission):
            events = "".join(chunk for index, output in batch for chunk in tracker.chunks(index, output))
            if events:
                yield events
    except RequestFailed as exc:
        yield sse(error_body(exc.status_code, exc.message, exc.param, exc.code)) + sse("[DONE]")
        return
    yield (tracker.usage_chunk() if plan.include_usage else "") + sse("[DONE]")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pagedinfer")
    except PackageNotFoundError:
        return "unknown"
