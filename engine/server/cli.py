"""`pagedinfer serve`: the OpenAI-compatible server (its load generator is `pagedinfer bench`, engine/bench/).

The parser is built without importing torch, FastAPI or uvicorn; `run`
functions import what they need.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pagedinfer.contracts.config.serve_args import ServeArgs, add_serve_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    from pagedinfer.engine.engine_args import add_engine_args

    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible HTTP server",
        description="Serve a model over HTTP (OpenAI's /v1/completions and /v1/chat/completions, /v1/models,"
        " /health, /metrics, /version). Without --model it serves the small model embedded in the"
        " package.",
    )
    add_engine_args(serve)
    add_serve_args(serve)
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from pagedinfer.contracts.embedded_model import default_model_dir
    from pagedinfer.contracts.http.auth import resolve_api_key
    from pagedinfer.engine.engine_args import engine_config_from_args
    from pagedinfer.engine.server.app import ServerSettings
    from pagedinfer.engine.server.launcher import bind_listener, build_app, run_server

    opts = ServeArgs.from_args(args)
    logging.basicConfig(level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pagedinfer.engine.model_source import resolve_model_dir

    # a Hub id (what the operator passes for hf:// models) resolves to its cached snapshot here,
    # so a missing model fails before the engine thread starts, naming the flag
    model = resolve_model_dir(args.model, args.revision, name="--model") if args.model else str(default_model_dir())
    if not (Path(model) / "config.json").is_file():
        raise ValueError(f"--model: {args.model!r} is not a model directory (no config.json there)")
    engine_config = engine_config_from_args(args, model=model)
    settings = ServerSettings(
        api_key=resolve_api_key(opts.api_key),
        max_waiting_requests=opts.max_waiting_requests,
        max_request_body_bytes=opts.max_request_body_bytes,
        body_timeout_seconds=args.request_body_timeout_seconds,
    )
    # a Hub id names the model as given (as vLLM does), not by its snapshot's commit folder
    hub_id = args.model if args.model and model != args.model else None
    kv_events = None
    if opts.kv_events:
        from pagedinfer.engine.kv_events.publisher import KVEventsConfig

        kv_events = KVEventsConfig(
            host=opts.host, port=opts.kv_events_port, heartbeat_interval_seconds=opts.kv_events_heartbeat_seconds
        )
    app, engine_loop = build_app(engine_config, settings, opts.served_model_name or hub_id, kv_events)
    listener = bind_listener(opts.host, opts.port)  # a port in use is an error before the address is announced
    print(f"pagedinfer serve: http://{opts.host}:{opts.port} (model {model})", file=sys.stderr, flush=True)
    return run_server(
        app,
        engine_loop,
        opts.host,
        opts.port,
        opts.shutdown_grace_seconds,
        opts.log_level,
        args.request_header_timeout_seconds,
        listener=listener,
    )
