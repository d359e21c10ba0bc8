"""The server's KV-event endpoints: discovery and snapshot (outside /v1, no API key, no body).

GET /kv_events           where to subscribe, and how blocks are hashed
GET /kv_events/snapshot  the cached block hashes (hex) and the sequence number they are exact at

A consumer needs only the engine's HTTP URL: it reads /kv_events, subscribes
to the PUB port on the URL's host, then takes a snapshot and applies the
batches numbered above it (see docs/router.md).
"""

from __future__ import annotations

from typing import Any

from pagedinfer.engine.block_pool import HASH_ALGORITHM, ROOT_HASH_SEED
from pagedinfer.engine.kv_events.publisher import KVEventPublisher


def discovery(publisher: KVEventPublisher | None) -> dict[str, Any]:
    if publisher is None:
        return {"enabled": False}
    return {"enabled": True, "format": "vllm-kv-events-msgpack", "pub_port": publisher.pub_port,
            "replay_port": publisher.replay_port, "topic": publisher.config.topic,
            "block_size": publisher.block_size, "hash_algorithm": HASH_ALGORITHM,
            "hash_seed": ROOT_HASH_SEED.decode()}


def install_kv_event_routes(app: Any, publisher: KVEventPublisher | None) -> None:
    from pagedinfer.engine.server.errors import ApiError

    @app.get("/kv_events")
    async def kv_events() -> dict:
        return discovery(publisher)

    @app.get("/kv_events/snapshot")
    async def kv_events_snapshot() -> dict:
        if publisher is None:
            raise ApiError(404, "KV events are off: start the server with --kv-events", code="kv_events_disabled")
        snap = publisher.snapshot()
        return {"sequence": snap.sequence, "block_size": publisher.block_size,
                "block_hashes": sorted(h.hex() for h in snap.block_hashes)}
