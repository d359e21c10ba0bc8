"""`pagedinfer router`: a prefix-aware OpenAI front for several `pagedinfer serve --kv-events` engines."""

from __future__ import annotations

import argparse
import logging
import sys

from pagedinfer.contracts.config import cli_types
from pagedinfer.contracts.http.read_timeouts import add_read_timeout_args
from pagedinfer.contracts.routing.demand import INFERENCESERVICE_NAME_ENV, INFERENCESERVICE_NAMESPACE_ENV
from pagedinfer.contracts.routing.lifecycle import (
    DISCOVERY_POLL_INTERVAL_SECONDS,
    WARMED_CONDITION,
    WARMUP_GATE_TIMEOUT_SECONDS,
)
from pagedinfer.contracts.routing.policies import POLICIES
from pagedinfer.contracts.routing.warmup import DEFAULT_PREFIXES, DEFAULT_TOKEN_BUDGET
from pagedinfer.router.hold.queue import (
    DEFAULT_KEEPALIVE_SECONDS,
    DEFAULT_MAX_QUEUED_REQUESTS,
    DEFAULT_QUEUE_TIMEOUT_SECONDS,
)
from pagedinfer.router.upstream import DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS

# Libraries whose INFO lines are one per upstream request (httpx logs each, health checks included: 4 lines a
# second with 2 engines); quiet below WARNING unless the router itself logs at DEBUG.
CHATTY_LOGGERS = ("httpx", "httpcore")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "router",
        help="route OpenAI requests across engines by cached prefix",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics, sending each"
        " request to one of the --engine servers (start them with --kv-events). See docs/router.md.",
    )
    p.add_argument(
        "--engine",
        dest="engines",
        action="append",
        type=cli_types.http_url,
        default=[],
        metavar="URL",
        help="an engine's base URL, e.g. http://127.0.0.2:8000 (repeat for each)",
    )
    k = p.add_argument_group("in a cluster (instead of --engine)")
    k.add_argument(
        "--discover-service",
        default=None,
        metavar="NAME",
        help="follow the ready endpoints of this Service's EndpointSlices (the engines' headless"
        " Service); needs namespace-scoped list on endpointslices",
    )
    k.add_argument(
        "--namespace", default=None, help="the Service's namespace (default: the pod's own, from its service account)"
    )
    k.add_argument("--engine-port-name", default="http", help="the EndpointSlice port of the engines' HTTP server")
    k.add_argument(
        "--kube-api",
        type=cli_types.http_url,
        default=None,
        help="the API server's URL (default: in-cluster, with the service-account token)",
    )
    k.add_argument(
        "--discovery-poll-interval-seconds",
        type=cli_types.positive_seconds,
        default=DISCOVERY_POLL_INTERVAL_SECONDS,
        help="list the EndpointSlices this often; a terminating engine leaves the candidates within it"
        " (the operator sizes the engines' preStop wait from the default,"
        f" {DISCOVERY_POLL_INTERVAL_SECONDS:g})",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="prefix",
        help="prefix: longest cached prefix, spread under saturation (default); least-load; round-robin",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=cli_types.port, default=8080, help="port to listen on (default 8080)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/* (default: env PAGEDINFER_API_KEY, else"
        " none); the header is passed on to the engines",
    )
    p.add_argument(
        "--max-request-body-bytes",
        type=cli_types.positive_int,
        default=1 << 20,
        help="answer 413 to bodies larger than this (default 1 MiB)",
    )
    add_read_timeout_args(p)
    p.add_argument(
        "--upstream-first-byte-timeout-seconds",
        type=cli_types.positive_seconds,
        default=DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS,
        help="a streamed request's headers must come from its engine within this many seconds, else it"
        " is tried on another engine (nothing was received, so it never runs twice); non-streamed"
        f" requests have no such bound (default {DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS:g})",
    )
    q = p.add_argument_group("holding requests while no engine is ready (scale to zero; docs/router.md)")
    q.add_argument(
        "--queue-timeout-seconds",
        type=cli_types.positive_seconds,
        default=DEFAULT_QUEUE_TIMEOUT_SECONDS,
        help="a request that finds no ready engine waits this long, from its arrival, for one; then 503"
        f" + Retry-After naming why (default {DEFAULT_QUEUE_TIMEOUT_SECONDS:g})",
    )
    q.add_argument(
        "--max-queued-requests",
        type=cli_types.positive_int,
        default=DEFAULT_MAX_QUEUED_REQUESTS,
        help="most requests held at once; one more gets 503 + Retry-After at once"
        f" (default {DEFAULT_MAX_QUEUED_REQUESTS})",
    )
    q.add_argument(
        "--queue-keepalive-seconds",
        type=cli_types.positive_seconds,
        default=DEFAULT_KEEPALIVE_SECONDS,
        help="a held stream gets its headers and an SSE comment line (': keep-alive') every this many"
        f" seconds while it waits (default {DEFAULT_KEEPALIVE_SECONDS:g})",
    )
    q.add_argument(
        "--demand-inferenceservice",
        default=None,
        metavar="NAMESPACE/NAME",
        help="annotate this InferenceService with pagedinfer.io/demand-at while requests wait and no"
        " engine can be woken (default: env"
        f" {INFERENCESERVICE_NAMESPACE_ENV}/{INFERENCESERVICE_NAME_ENV}, which the operator sets;"
        " unset: no signal); talks to --kube-api, else in-cluster",
    )
    w = p.add_argument_group("warm-up: hot prefixes replayed to a new engine and, on scale-in, to the survivors")
    w.add_argument(
        "--warmup-prefixes",
        type=cli_types.non_negative_int,
        default=DEFAULT_PREFIXES,
        metavar="K",
        help=f"replay the K hottest prefixes the router has seen (0: no warm-up; default {DEFAULT_PREFIXES})",
    )
    w.add_argument(
        "--warmup-token-budget",
        type=cli_types.non_negative_int,
        default=DEFAULT_TOKEN_BUDGET,
        metavar="TOKENS",
        help=f"at most this many prompt tokens replayed to one engine per event (default {DEFAULT_TOKEN_BUDGET})",
    )
    w.add_argument(
        "--warmup-readiness-gate",
        action="store_true",
        help="with --discover-service: also follow the not-ready endpoints, warm each new one and then set its"
        f" pod's {WARMED_CONDITION} condition (its readiness gate; the operator adds both with warm-up on), at"
        f" the latest {WARMUP_GATE_TIMEOUT_SECONDS:g} s after it is healthy; needs patch on pods/status",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="the engines' tokenizer directory (default: the engines' own, fetched from the first that"
        " publishes KV events; the embedded model's until then)",
    )
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run_router)


def run_router(args: argparse.Namespace) -> int:
    import uvicorn

    from pagedinfer.contracts.http.auth import resolve_api_key
    from pagedinfer.contracts.http.graceful_exit import exit_zero_after_sigterm
    from pagedinfer.contracts.http.header_timeout import header_timeout_protocol
    from pagedinfer.router.app import RouterSettings, create_router_app
    from pagedinfer.router.hold.queue import HoldSettings
    from pagedinfer.router.warmup.settings import WarmupSettings

    configure_logging(args.log_level)
    if len(set(args.engines)) != len(args.engines):
        raise ValueError("--engine: each engine URL may be given once")
    if bool(args.engines) == bool(args.discover_service):
        raise ValueError("give either --engine URL (repeated) or --discover-service NAME, not both or neither")
    discovery = None
    if args.discover_service:
        from pagedinfer.router.discovery import DiscoverySettings, in_cluster_namespace

        namespace = args.namespace or in_cluster_namespace()
        if not namespace:
            raise ValueError("--namespace: required outside a pod (no service-account namespace file)")
        discovery = DiscoverySettings(
            args.discover_service,
            namespace,
            args.engine_port_name,
            args.kube_api,
            args.discovery_poll_interval_seconds,
            readiness_gate=args.warmup_readiness_gate,
        )
    elif args.warmup_readiness_gate:
        raise ValueError("--warmup-readiness-gate: needs --discover-service (the gate is a pod's condition)")
    settings = RouterSettings(
        tuple(args.engines),
        args.policy,
        resolve_api_key(args.api_key),
        args.tokenizer,
        discovery,
        args.max_request_body_bytes,
        args.request_body_timeout_seconds,
        args.upstream_first_byte_timeout_seconds,
        HoldSettings(args.queue_timeout_seconds, args.max_queued_requests, args.queue_keepalive_seconds),
        demand_target(args.demand_inferenceservice, args.kube_api),
        WarmupSettings(args.warmup_prefixes, args.warmup_token_budget),
    )
    app = create_router_app(settings)
    upstream = ", ".join(args.engines) or f"service {args.discover_service}"
    print(
        f"pagedinfer router: http://{args.host}:{args.port} -> {upstream} ({args.policy})", file=sys.stderr, flush=True
    )
    exit_zero_after_sigterm()
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_keep_alive=5,
        http=header_timeout_protocol(args.request_header_timeout_seconds),
    )
    router_server_class()(config, app).run()
    return 0


def router_server_class():
    import uvicorn

    class RouterServer(uvicorn.Server):
        """uvicorn's server, whose exit signal also closes the hold queue: held requests get their 503 now
        instead of keeping the process up (uvicorn waits for every open request) until their deadlines."""

        def __init__(self, config, app) -> None:
            super().__init__(config)
            self.app = app

        def handle_exit(self, sig, frame) -> None:
            hold, loop = getattr(self.app.state, "hold", None), getattr(self.app.state, "loop", None)
            if hold is not None and loop is not None:
                loop.call_soon_threadsafe(hold.close)
            super().handle_exit(sig, frame)

    return RouterServer


def demand_target(flag: str | None, api_url: str | None):
    """The InferenceService to signal demand on: the flag's NAMESPACE/NAME, else the operator's env vars."""
    from pagedinfer.router.hold.demand import DemandTarget

    if flag is None:
        return DemandTarget.from_env(api_url)
    namespace, sep, name = flag.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--demand-inferenceservice: expected NAMESPACE/NAME, got {flag!r}")
    return DemandTarget(name, namespace, api_url)


def configure_logging(log_level: str) -> None:
    """The router's own loggers at `log_level`; httpx's per-request lines only at DEBUG."""
    level = getattr(logging, log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else max(logging.WARNING, level))
