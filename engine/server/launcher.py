"""Build and run one server: engine factory, app, uvicorn, signals.

Shutdown on SIGTERM (or SIGINT): uvicorn stops accepting connections and
waits for in-flight responses; at the same moment the engine loop starts
draining: it refuses new requests, lets running ones finish, and once
`shutdown_grace_seconds` have passed aborts the rest, whose responses then end
with a 503 error (streams: an error event and [DONE]). uvicorn's own
graceful timeout, a few seconds later, is only a backstop that cancels
responses still stuck. Then the lifespan stops the engine loop.

uvicorn re-raises the signal it caught once it is done, to let the previous
handler run. For SIGTERM the previous handler would be the default one,
which kills the process with status 143; `run_server` installs a no-op
SIGTERM handler first, so a graceful shutdown exits 0.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from pagedinfer.engine.model_source import default_model_dir
from pagedinfer.engine.server.app import ServerSettings, create_app
from pagedinfer.engine.server.engine_loop import EngineLoop, ModelInfo
from pagedinfer.engine.server.metrics import ServerMetrics

logger = logging.getLogger("pagedinfer.server")

DEFAULT_MODEL_NAME = "pagedinfer-default"
SHUTDOWN_BACKSTOP_SECONDS = 5.0


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
        if kv_events is not None:
            engine.kv.pool.event_sink = kv_events.record
        tokenizer = AutoTokenizer.from_pretrained(str(engine_config.tokenizer or engine_config.model))
        config = engine.config
        info = ModelInfo(served_model_name=served_model_name, max_model_len=int(engine.max_model_len),
                         max_num_seqs=config.max_num_seqs, vocab_size=int(engine.runner.vocab_size),
                         block_size=config.block_size, num_gpu_blocks=int(engine.num_gpu_blocks),
                         gpu_memory_utilization=config.gpu_memory_utilization,
                         enable_prefix_caching=config.enable_prefix_caching, tokenizer=tokenizer)
        return engine, info

    return build


def build_app(engine_config: Any, settings: ServerSettings, served_model_name: str | None = None,
              kv_events: Any = None):
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


def uvicorn_server(app: Any, host: str, port: int, shutdown_grace_seconds: float, log_level: str = "info",
                   engine_loop: EngineLoop | None = None):
    """A uvicorn server whose exit signal also starts draining the engine loop."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if engine_loop is not None:
                engine_loop.begin_drain(shutdown_grace_seconds)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=shutdown_grace_seconds + SHUTDOWN_BACKSTOP_SECONDS,
                            timeout_keep_alive=5)
    return DrainingServer(config)


def run_server(app: Any, engine_loop: EngineLoop, host: str, port: int, shutdown_grace_seconds: float,
               log_level: str = "info") -> int:
    """Serve until SIGTERM/SIGINT; 0 after a graceful shutdown, 1 if the model failed to load."""
    server = uvicorn_server(app, host, port, shutdown_grace_seconds, log_level, engine_loop)

    def exit_if_load_fails() -> None:
        engine_loop.ready.wait()
        if engine_loop.load_error is not None:
            server.should_exit = True

    threading.Thread(target=exit_if_load_fails, name="pagedinfer-load-watch", daemon=True).start()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run()
    if engine_loop.load_error is not None:
        logger.error("the model could not be loaded: %s", engine_loop.load_error)
        return 1
    return 0
