"""Fixtures: two real engines (`--kv-events`) on the tiny Llama, and a router in front of them."""

from __future__ import annotations

import pytest
from router_harness import start_router
from serving_harness import start_server, stop_server

from pagedinfer.engine.kv_events.publisher import KVEventsConfig


@pytest.fixture(scope="module")
def engines(tiny_llama):
    running = [start_server(tiny_llama, kv_events=KVEventsConfig(port=0)) for _ in range(2)]
    yield running
    for r in running:
        stop_server(r)


@pytest.fixture
def router(engines, tiny_llama):
    running = start_router([e.url for e in engines], tiny_llama)
    yield running
    running.stop()
