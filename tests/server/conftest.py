"""Fixtures: one real server on a tiny random-weight Llama, shared by the session, and an openai client."""

from __future__ import annotations

import pytest
from serving_harness import start_server, stop_server


@pytest.fixture(scope="session")
def server(tiny_llama):
    running = start_server(tiny_llama)
    yield running
    stop_server(running)


@pytest.fixture(scope="session")
def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
