"""The server's own options of `pagedinfer serve`: one annotated definition each (`contracts/config/options.py`).

The engine's options are `EngineConfig`'s fields; these are the server's:
its name for the model, where it listens, its limits and its KV-cache
events. The operator derives the flags it sets on every pod (`managed`) from
both. The read deadlines are the router's as well and keep their own
definition (`read_timeouts.add_read_timeout_args`). Torch-free and
import-light: the operator imports this module.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pagedinfer.contracts.config import cli_types
from pagedinfer.contracts.config.options import add_flags, flag_field, values_from_args
from pagedinfer.contracts.http.read_timeouts import add_read_timeout_args

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
DEFAULT_MAX_WAITING_REQUESTS = 1024  # the admission limit (engine/server/admission.py)
DEFAULT_HEARTBEAT_INTERVAL_SECONDS = 0.5  # the KV-event heartbeat (contracts/kv_events/heartbeat.py)


@dataclass(frozen=True)
class ServeArgs:
    """What `pagedinfer serve` takes besides the engine's options."""

    served_model_name: str | None = flag_field(
        None,
        flag="--served-model-name",
        managed=True,
        help="the name clients pass as `model` (default: the Hub id as given, else the model"
        " directory's name; 'pagedinfer-default' for the embedded model)",
    )
    host: str = flag_field("127.0.0.1", flag="--host", managed=True, help="address to listen on (default 127.0.0.1)")
    port: int = flag_field(
        8000, flag="--port", type=cli_types.port, managed=True, help="port to listen on, 1-65535 (default 8000)"
    )
    api_key: str | None = flag_field(
        None,
        flag="--api-key",
        managed=True,
        help="require 'Authorization: Bearer KEY' on /v1/* (default: env PAGEDINFER_API_KEY, else none)",
    )
    max_waiting_requests: int = flag_field(
        DEFAULT_MAX_WAITING_REQUESTS,
        flag="--max-waiting-requests",
        type=cli_types.positive_int,
        help="most sequences (prompts x n) waiting to be scheduled; a request that would go over it gets"
        " 503 + Retry-After, one that alone exceeds it a 400"
        f" (default {DEFAULT_MAX_WAITING_REQUESTS})",
    )
    max_request_body_bytes: int = flag_field(
        1 << 20,
        flag="--max-request-body-bytes",
        type=cli_types.positive_int,
        help="answer 413 to bodies larger than this (default 1 MiB)",
    )
    shutdown_grace_seconds: float = flag_field(
        30.0,
        flag="--shutdown-grace-seconds",
        type=cli_types.non_negative_seconds,
        help="on SIGTERM, how long in-flight requests may run before they are aborted (default 30)",
    )
    log_level: str = flag_field("info", flag="--log-level", choices=LOG_LEVELS, help=None)
    kv_events: bool = flag_field(
        False,
        flag="--kv-events",
        help="publish the prefix cache's BlockStored/BlockRemoved/AllBlocksCleared events (vLLM's"
        " ZeroMQ format) on --host, and serve GET /kv_events (discovery), GET /kv_events/snapshot"
        " and GET /kv_events/tokenizer (behind --api-key)",
    )
    kv_events_port: int = flag_field(
        5557,
        flag="--kv-events-port",
        type=cli_types.port_or_zero,
        help="the PUB port; replay answers on the port above it; 0 binds any free ports (default 5557)",
    )
    kv_events_heartbeat_seconds: float = flag_field(
        DEFAULT_HEARTBEAT_INTERVAL_SECONDS,
        flag="--kv-events-heartbeat-seconds",
        type=cli_types.non_negative_seconds,
        help="send a heartbeat naming the newest batch this often, so a router notices a lost batch or a silent"
        " publisher within about this long; 0: none (the router then cannot tell silence from an idle"
        f" engine) (default {DEFAULT_HEARTBEAT_INTERVAL_SECONDS:g})",
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeArgs:
        return cls(**values_from_args(cls, args))


def add_serve_args(serve: argparse.ArgumentParser) -> None:
    """The server's flags, in its two help groups, the read deadlines among them."""
    g = serve.add_argument_group("server")
    add_flags(
        g, ServeArgs, ("served_model_name", "host", "port", "api_key", "max_waiting_requests", "max_request_body_bytes")
    )
    add_read_timeout_args(g)
    add_flags(g, ServeArgs, ("shutdown_grace_seconds", "log_level"))
    add_flags(
        serve.add_argument_group("KV-cache events (for a prefix-aware router; docs/router.md)"),
        ServeArgs,
        ("kv_events", "kv_events_port", "kv_events_heartbeat_seconds"),
    )
