"""A router without --tokenizer tokenizes as its engines do: it fetches their tokenizer from them.

The engines here run a model whose tokenizer is not the embedded model's, as an `hf://` model's is not: with
the embedded tokenizer the router's block hashes would never match the engine's, and prefix routing would
fall back to hashing (the operator's router for `hf://` models before this).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from router_harness import route_of, start_router, wait_for
from serving_harness import start_server, stop_server

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.contracts.http.errors import install_error_handlers
from pagedinfer.contracts.kv_events.tokenizer_files import fingerprint, tokenizer_files
from pagedinfer.engine.kv_events.publisher import KVEventsConfig
from pagedinfer.engine.kv_events.routes import install_kv_event_routes
from pagedinfer.engine.tiny_model import train_tokenizer
from pagedinfer.router.request_tokens import RequestTokenizer

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
CORPUS = [
    "quartz zebras jump over vexing fjords while wizards box the jukebox",
    "seven tenants share one prefix and the router keeps each on its engine",
]
PROMPT = "The tenant's long system prompt says the same thing again and again. " * 4


@pytest.fixture(scope="module")
def own_tokenizer_model(make_model, tmp_path_factory):
    tokenizer_dir = tmp_path_factory.mktemp("own-tokenizer")
    train_tokenizer(tokenizer_dir, vocab_size=320, corpus=CORPUS)
    return make_model("llama", tokenizer_dir=str(tokenizer_dir))


@pytest.fixture(scope="module")
def engine(own_tokenizer_model):
    running = start_server(own_tokenizer_model, api_key=KEY, kv_events=KVEventsConfig(port=0))
    yield running
    stop_server(running)


def test_the_engine_serves_its_tokenizer_behind_its_key_and_it_tokenizes_as_the_engine(engine, own_tokenizer_model):
    from transformers import AutoTokenizer

    sha256 = httpx.get(engine.url + "/kv_events", timeout=30).json()["tokenizer_sha256"]
    assert httpx.get(engine.url + "/kv_events/tokenizer", timeout=30).status_code == 401
    body = httpx.get(engine.url + "/kv_events/tokenizer", headers=AUTH, timeout=30).json()
    assert body["sha256"] == sha256 == fingerprint(body["files"])
    served = RequestTokenizer.from_files(body["files"], engine.url)
    ours = AutoTokenizer.from_pretrained(str(own_tokenizer_model))
    embedded = RequestTokenizer(str(default_model_dir()))
    assert embedded.encode(PROMPT, add_special_tokens=True) != ours.encode(PROMPT)  # the point of fetching
    for text in (PROMPT, "zebras <s> and </s> jukebox", "ünïcödé, tabs\tand\nnewlines"):
        assert served.encode(text, add_special_tokens=True) == ours.encode(text)
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hi"}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert served.prompt_ids({"messages": messages}, chat=True) == ours.encode(rendered, add_special_tokens=False)


def test_without_kv_events_there_is_no_tokenizer_and_one_without_a_fast_form_is_refused(own_tokenizer_model):
    from transformers import AutoTokenizer

    app = FastAPI()
    install_error_handlers(app)
    install_kv_event_routes(app, None, lambda: AutoTokenizer.from_pretrained(str(own_tokenizer_model)))
    client = TestClient(app)
    assert client.get("/kv_events").json() == {"enabled": False}
    answer = client.get("/kv_events/tokenizer")
    assert answer.status_code == 404 and "--kv-events" in answer.json()["error"]["message"]
    with pytest.raises(ValueError, match="no fast tokenizer to serve"):
        tokenizer_files(object())


def test_a_router_without_a_tokenizer_takes_the_engines_and_routes_by_its_prefixes(engine):
    router = start_router([engine.url], None, api_key=KEY)
    try:
        tokenizer = router.app.state.tokenizer
        sha256 = httpx.get(engine.url + "/kv_events", timeout=30).json()["tokenizer_sha256"]
        wait_for(lambda: tokenizer.sha256 == sha256, "the router never took the engine's tokenizer")
        assert tokenizer.source == f"engine {engine.url}"
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2}
        assert httpx.post(router.url + "/v1/completions", json=body, headers=AUTH, timeout=60).status_code == 200
        state = router.app.state.router
        wait_for(lambda: len(state.engines[engine.url].hashes) >= 3, "the engine's blocks never reached the router")
        again = httpx.post(
            router.url + "/v1/completions", json={**body, "prompt": PROMPT + " More."}, headers=AUTH, timeout=60
        )
        route = route_of(again)
        assert route["reason"] == "prefix-hit" and int(route["matched_tokens"]) >= 3 * 16, route

        # a fingerprint the files do not have is not taken: the current tokenizer stays
        async def offer_wrong():
            async with httpx.AsyncClient() as client:
                await tokenizer.offer(client, engine.url, "0" * 64)

        asyncio.run(offer_wrong())
        assert tokenizer.sha256 == sha256 and tokenizer.source == f"engine {engine.url}"
    finally:
        router.stop()


def test_a_routers_own_tokenizer_is_kept(engine):
    router = start_router([engine.url], default_model_dir())
    try:
        state = router.app.state.router
        wait_for(lambda: state.engines[engine.url].block_size is not None, "the router never followed the engine")
        tokenizer = router.app.state.tokenizer
        assert tokenizer.pinned and tokenizer.sha256 is None and tokenizer.source.startswith("--tokenizer ")
    finally:
        router.stop()
