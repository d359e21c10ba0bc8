"""Build and run one server: engine factory, app, uvicorn, signals.

Shutdown on SIGTERM (or SIGINT): uvicorn stops accepting connections and
waits for in-flight responses; at the same moment the engine loop starts
draining: it refuses new requests, lets running ones finish, and once
`shutdown_grace_seconds` have passed aborts the rest, whose responses then end
with a 503 error (streams: an error event and [DONE]). uvicorn's own
graceful timeout, a few seconds later, is only a backstop that cancels
responses still stuck. Then the lifespan stops the engine loop.

A second SIGINT (Ctrl-C twice) ends the grace period at once
(`EngineLoop.end_grace_now`) instead of uvicorn's force-quit: the in-flight
requests get their 503 (streams: an error event and [DONE]) and the shutdown
completes in order, without tracebacks.

uvicorn re-raises the signal it caught once it is done; `run_server` makes
that harmless first (`contracts/http/graceful_exit.py`) and chooses the status itself: 0
after SIGTERM, 130 (128 + SIGINT, as a shell reports Ctrl-C) after one or
two SIGINTs. A signal during the model load stops the process at once
(with that same status): the engine loop does not wait for the load (`EngineLoop.stop`), and the process
ends without waiting for the loading thread (`graceful_exit.exit_now`); the
engine is never reported ready.

The listening socket is bound before anything else starts: a port already in
use (or a host that is not ours) fails in milliseconds as a flag error (exit
2), instead of after the model has loaded.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.contracts.http.graceful_exit import absorb_reraised_signals, exit_now
from pagedinfer.contracts.http.header_timeout import header_timeout_protocol
from pagedinfer.contracts.http.read_timeouts import DEFAULT_HEADER_TIMEOUT_SECONDS
from pagedinfer.engine.server.app import ServerSettings, create_app
from pagedinfer.engine.server.engine_loop import EngineLoop, ModelInfo
from pagedinfer.engine.server.metrics import ServerMetrics
from pagedinfer.engine.server.prompt_chars import max_chars_per_token

logger = logging.getLogger("pagedinfer.server")

DEFAULT_MODEL_NAME = "pagedinfer-default"
SHUTDOWN_BACKSTOP_SECONDS = 5.0
LISTEN_BACKLOG = 2048  # uvicorn's default, which it sets again when it starts serving on the socket


def served_name(model: str, served_model_name: str | None) -> str:
    if served_model_name:
        return served_model_name
    if Path(model).resolve() == default_model_dir().resolve():
        return DEFAULT_MODEL_NAME
    return Path(model).name or str(model)


def engine_factory(engine_config: Any, served_model_name: str, kv_events: Any = None):
    """A callable that loads the engine and the server's own tokenizer (run on the engine thread).

    kv_events: a KVEventPublisher the engine's block pool reports to, or None.
    """

    def build() -> tuple[Any, ModelInfo]:
        from transformers import AutoTokenizer

        from pagedinfer.engine import LLMEngine

        engine = LLMEngine(engine_config)
        engine.warm_up_structured_outputs()  # never in a request's path: it stalled the step loop for seconds
        if kv_events is not None:
            engine.kv.pool.event_sink = engine.kv.host.event_sink = kv_events.record  # device pool and host tier
        tokenizer = AutoTokenizer.from_pretrained(str(engine_config.tokenizer or engine_config.model))
        config = engine.config
        info = ModelInfo(
            served_model_name=served_model_name,
            max_model_len=int(engine.max_model_len),
            max_num_seqs=config.max_num_seqs,
            vocab_size=int(engine.runner.vocab_size),
            block_size=config.block_size,
            num_gpu_blocks=int(engine.num_gpu_blocks),
            gpu_memory_utilization=config.gpu_memory_utilization,
            enable_prefix_caching=config.enable_prefix_caching,
            tokenizer=tokenizer,
            max_chars_per_token=max_chars_per_token(tokenizer),
            structured=engine.structured,
        )
        return engine, info

    return build


def build_app(
    engine_config: Any, settings: ServerSettings, served_model_name: str | None = None, kv_events: Any = None
):
    """(app, engine_loop) for one model; nothing is loaded until the app's lifespan starts.

    kv_events: a KVEventsConfig (`--kv-events`): its sockets are bound here, so a
    port in use fails before the model loads.
    """
    name = served_name(str(engine_config.model), served_model_name)
    metrics = ServerMetrics(name)
    publisher = None
    if kv_events is not None:
        from pagedinfer.engine.kv_events.publisher import KVEventPublisher

        publisher = KVEventPublisher(kv_events, engine_config.block_size)
        publisher.start()
    loop = EngineLoop(engine_factory(engine_config, name, publisher), observer=metrics)
    return create_app(loop, metrics, settings, publisher), loop


def uvicorn_server(
    app: Any,
    host: str,
    port: int,
    shutdown_grace_seconds: float,
    log_level: str = "info",
    engine_loop: EngineLoop | None = None,
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS,
):
    """A uvicorn server whose exit signal also starts draining the engine loop.

    HTTP/1.1 through h11 always (never httptools, whatever is installed), with
    a deadline on each request's headers (`contracts/http/header_timeout.py`).
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            self.stop_signals: list[int] = []  # the signals that asked it to stop, in order

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.stop_signals.append(sig)
            if self.should_exit and sig == signal.SIGINT:
                # a second Ctrl-C: not uvicorn's force-quit (which cancels responses mid-write, 500s in
                # text/plain and tracebacks) but the end of the grace period, now: every in-flight
                # request is answered with its 503 and the shutdown completes in order
                if engine_loop is not None:
                    engine_loop.end_grace_now()
                return
            if engine_loop is not None:
                engine_loop.begin_drain(shutdown_grace_seconds)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        http=header_timeout_protocol(header_timeout_seconds),
        timeout_graceful_shutdown=shutdown_grace_seconds + SHUTDOWN_BACKSTOP_SECONDS,
        timeout_keep_alive=5,
    )
    return DrainingServer(config)


def exit_status(stop_signals: list[int]) -> int:
    """The status of a shutdown that went in order: 130 (128 + SIGINT) if Ctrl-C asked for it, else 0."""
    return 128 + signal.SIGINT if signal.SIGINT in stop_signals else 0


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) and listening (uvicorn accepts on it); ValueError naming the flag.

    It listens at once: with SO_REUSEADDR, Linux lets a second socket bind a
    port whose first one is bound but not yet listening, so a second `serve`
    started during the first one's start-up would pass this check and fail
    later, at uvicorn's listen. Connections that come before uvicorn accepts
    wait in the backlog.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT does not block a restart
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        flag = "--port" if exc.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"
        raise ValueError(f"{flag}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def run_server(
    app: Any,
    engine_loop: EngineLoop,
    host: str,
    port: int,
    shutdown_grace_seconds: float,
    log_level: str = "info",
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS,
    listener: socket.socket | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; `exit_status` after a graceful shutdown (0; 130 for Ctrl-C), 1 if the model
    failed to load or the engine failed.

    `listener`: a socket from `bind_listener(host, port)`, or None to bind one
    here. An engine failure shuts the server down like SIGTERM, except that
    every in-flight request has already been answered with a 500.
    """
    if listener is None:
        listener = bind_listener(host, port)
    server = uvicorn_server(app, host, port, shutdown_grace_seconds, log_level, engine_loop, header_timeout_seconds)

    def exit_if_the_engine_fails() -> None:
        engine_loop.ready.wait()
        if engine_loop.load_error is None:
            engine_loop.failed.wait()
        server.should_exit = True

    threading.Thread(target=exit_if_the_engine_fails, name="pagedinfer-engine-watch", daemon=True).start()
    absorb_reraised_signals()
    server.run(sockets=[listener])
    if engine_loop.loading:  # SIGTERM (or SIGINT) during the load: a graceful stop, not a wait for the model
        logger.info("stopped while the model was loading; exiting without waiting for the load")
        exit_now(exit_status(server.stop_signals))
    if engine_loop.load_error is not None:
        logger.error("the model could not be loaded: %s", engine_loop.load_error)
        return 1
    if engine_loop.engine_error is not None:
        logger.error("exiting with status 1: the engine failed (%s)", type(engine_loop.engine_error).__name__)
        return 1
    return exit_status(server.stop_signals)
