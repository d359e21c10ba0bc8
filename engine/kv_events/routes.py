"""The server's KV-event endpoints: discovery, snapshot and tokenizer (outside /v1, no body).

GET /kv_events            where to subscribe, how blocks are hashed, the tokenizer's fingerprint, the
                          heartbeat interval (null: none) and the publisher's epoch (`heartbeat.py`)
GET /kv_events/snapshot   the cached block hashes (hex), the sequence number they are exact at, the epoch;
                          the hashes are the device pool's (`block_hashes`) and the host tier's
                          (`cpu_block_hashes`, medium CPU)
GET /kv_events/tokenizer  the engine's tokenizer as files (`contracts/kv_events/tokenizer_files.py`): behind the API key
                          when the server has one, as /v1 is (a gated model's vocabulary is the model's)

A consumer needs only the engine's HTTP URL: it reads /kv_events, subscribes
to the PUB port on the URL's host, then takes a snapshot and applies the
batches numbered above it (see docs/router.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pagedinfer.contracts.kv_events.block_hash import HASH_ALGORITHM, ROOT_HASH_SEED
from pagedinfer.contracts.kv_events.tokenizer_files import TOKENIZER_PATH, TokenizerFiles, tokenizer_files
from pagedinfer.engine.kv_events.publisher import KVEventPublisher


def discovery(publisher: KVEventPublisher | None, tokenizer: TokenizerFiles | None = None) -> dict[str, Any]:
    if publisher is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "format": "vllm-kv-events-msgpack",
        "pub_port": publisher.pub_port,
        "replay_port": publisher.replay_port,
        "topic": publisher.config.topic,
        "block_size": publisher.block_size,
        "hash_algorithm": HASH_ALGORITHM,
        "hash_seed": ROOT_HASH_SEED.decode(),
        "tokenizer_sha256": tokenizer.sha256 if tokenizer is not None else None,
        "heartbeat_interval_seconds": publisher.config.heartbeat_interval_seconds or None,
        "epoch": publisher.epoch,
    }


def install_kv_event_routes(
    app: Any, publisher: KVEventPublisher | None, loaded_tokenizer: Callable[[], Any] = lambda: None
) -> None:
    """loaded_tokenizer: the server's transformers tokenizer once the model is loaded, else None."""
    from pagedinfer.contracts.http.errors import ApiError

    served: dict[int, TokenizerFiles | None] = {}  # id(tokenizer) -> its files (None: it has no fast backend)

    def files() -> TokenizerFiles | None:
        tokenizer = loaded_tokenizer()
        if publisher is None or tokenizer is None:
            return None
        if id(tokenizer) not in served:
            try:
                served[id(tokenizer)] = tokenizer_files(tokenizer)
            except ValueError:
                served[id(tokenizer)] = None
        return served[id(tokenizer)]

    @app.get("/kv_events")
    def kv_events() -> dict:  # sync: the first call serializes the tokenizer, on a worker thread
        return discovery(publisher, files())

    @app.get(TOKENIZER_PATH)
    def kv_events_tokenizer() -> dict:
        if publisher is None:
            raise ApiError(404, "KV events are off: start the server with --kv-events", code="kv_events_disabled")
        found = files()
        if found is None:
            raise ApiError(
                503,
                "the tokenizer is not loaded, or has no fast (tokenizer.json) form to serve",
                code="tokenizer_unavailable",
                headers={"Retry-After": "1"},
            )
        return found.body()

    @app.get("/kv_events/snapshot")
    async def kv_events_snapshot() -> dict:
        if publisher is None:
            raise ApiError(404, "KV events are off: start the server with --kv-events", code="kv_events_disabled")
        snap = publisher.snapshot()
        return {
            "sequence": snap.sequence,
            "epoch": publisher.epoch,
            "block_size": publisher.block_size,
            "block_hashes": sorted(h.hex() for h in snap.block_hashes),
            "cpu_block_hashes": sorted(h.hex() for h in snap.tier_block_hashes),
        }
