"""`pagedinfer serve`: the OpenAI-compatible server (its load generator is `pagedinfer bench`, engine/bench/).

The parser is built without importing torch, FastAPI or uvicorn; `run`
functions import what they need.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pagedinfer.engine.server import cli_types
from pagedinfer.engine.server.admission import DEFAULT_MAX_WAITING_REQUESTS
from pagedinfer.engine.server.read_timeouts import add_read_timeout_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    from pagedinfer.engine.engine_args import add_engine_args

    serve = sub.add_parser(
        "serve", help="run the OpenAI-compatible HTTP server",
        description="Serve a model over HTTP (OpenAI's /v1/completions and /v1/chat/completions, /v1/models,"
                    " /health, /metrics, /version). Without --model it serves the small model embedded in the"
                    " package.")
    add_engine_args(serve, model_required=False)
    g = serve.add_argument_group("server")
    g.add_argument("--served-model-name", default=None,
                   help="the name clients pass as `model` (default: the Hub id as given, else the model"
                        " directory's name; 'pagedinfer-default' for the embedded model)")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=cli_types.port, default=8000, help="port to listen on, 1-65535 (default 8000)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: env PAGEDINFER_API_KEY, else none)")
    g.add_argument("--max-waiting-requests", type=cli_types.positive_int, default=DEFAULT_MAX_WAITING_REQUESTS,
                   help="most sequences (prompts x n) waiting to be scheduled; a request that would go over it gets"
                        " 503 + Retry-After, one that alone exceeds it a 400"
                        f" (default {DEFAULT_MAX_WAITING_REQUESTS})")
    g.add_argument("--max-request-body-bytes", type=cli_types.positive_int, default=1 << 20,
                   help="answer 413 to bodies larger than this (default 1 MiB)")
    add_read_timeout_args(g)
    g.add_argument("--shutdown-grace-seconds", type=cli_types.non_negative_seconds, default=30.0,
                   help="on SIGTERM, how long in-flight requests may run before they are aborted (default 30)")
    g.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    kv = serve.add_argument_group("KV-cache events (for a prefix-aware router; docs/router.md)")
    kv.add_argument("--kv-events", action="store_true",
                    help="publish the prefix cache's BlockStored/BlockRemoved/AllBlocksCleared events (vLLM's"
                         " ZeroMQ format) on --host, and serve GET /kv_events (discovery) and"
                         " GET /kv_events/snapshot")
    kv.add_argument("--kv-events-port", type=cli_types.port_or_zero, default=5557,
                    help="the PUB port; replay answers on the port above it; 0 binds any free ports"
                         " (default 5557)")
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from pagedinfer.engine.engine_args import engine_config_from_args
    from pagedinfer.engine.server.app import ServerSettings
    from pagedinfer.engine.server.auth import resolve_api_key
    from pagedinfer.engine.server.launcher import bind_listener, build_app, default_model_dir, run_server

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pagedinfer.engine.model_source import resolve_model_dir

    # a Hub id (what the operator passes for hf:// models) resolves to its cached snapshot here,
    # so a missing model fails before the engine thread starts, naming the flag
    model = resolve_model_dir(args.model, args.revision, name="--model") if args.model else str(default_model_dir())
    if not (Path(model) / "config.json").is_file():
        raise ValueError(f"--model: {args.model!r} is not a model directory (no config.json there)")
    engine_config = engine_config_from_args(args, model=model)
    settings = ServerSettings(api_key=resolve_api_key(args.api_key), max_waiting_requests=args.max_waiting_requests,
                              max_request_body_bytes=args.max_request_body_bytes,
                              body_timeout_seconds=args.request_body_timeout_seconds)
    # a Hub id names the model as given (as vLLM does), not by its snapshot's commit folder
    hub_id = args.model if args.model and model != args.model else None
    kv_events = None
    if args.kv_events:
        from pagedinfer.engine.kv_events.publisher import KVEventsConfig

        kv_events = KVEventsConfig(host=args.host, port=args.kv_events_port)
    app, engine_loop = build_app(engine_config, settings, args.served_model_name or hub_id, kv_events)
    listener = bind_listener(args.host, args.port)  # a port in use is an error before the address is announced
    print(f"pagedinfer serve: http://{args.host}:{args.port} (model {model})", file=sys.stderr, flush=True)
    return run_server(app, engine_loop, args.host, args.port, args.shutdown_grace_seconds, args.log_level,
                      args.request_header_timeout_seconds, listener=listener)
