"""hf:// models: config.json comes from a configurable Hub endpoint, with a timeout and a cache."""

import asyncio
import dataclasses

import aiohttp.web
import pytest

from pagedinfer.operator.kv_plan.hub_config import HubConfigFetcher, ModelConfigError
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    FAST_CONFIG,
    ISVC,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    running_operator,
)

pytestmark = pytest.mark.timeout(60)

CONFIG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
async def hub():
    """A Hub-like server on 127.0.0.1: /{org}/{name}/resolve/{revision}/config.json."""
    seen = []

    async def config_json(request):
        seen.append((request.match_info["repo"], request.match_info["rev"], request.headers.get("Authorization")))
        repo = request.match_info["repo"]
        if repo == "slow/model":
            await asyncio.sleep(2)
        if repo == "meta-llama/Meta-Llama-3-8B":
            return aiohttp.web.json_response(CONFIG)
        if repo == "broken/model":
            return aiohttp.web.Response(text="{not json")
        return aiohttp.web.Response(status=404, text="Repository Not Found")

    app = aiohttp.web.Application()
    app.router.add_get("/{repo:[^/]+/[^/]+}/resolve/{rev}/config.json", config_json)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_fetches_once_and_serves_from_the_cache_with_the_token(hub):
    url, seen = hub
    fetcher = HubConfigFetcher(endpoint=url, token="hf_secret")
    assert await fetcher.get("meta-llama/Meta-Llama-3-8B") == CONFIG
    assert await fetcher.get("meta-llama/Meta-Llama-3-8B") == CONFIG
    assert fetcher.fetches == 1 and seen == [("meta-llama/Meta-Llama-3-8B", "main", "Bearer hf_secret")]
    assert "hf_secret" not in repr(fetcher)


@pytest.mark.parametrize(
    "repo, message",
    [("missing/model", "answered 404"), ("broken/model", "not valid JSON"), ("slow/model", "TimeoutError")],
)
async def test_failures_say_why_and_are_cached_briefly(hub, repo, message):
    url, _ = hub
    fetcher = HubConfigFetcher(endpoint=url, timeout_seconds=0.5)
    with pytest.raises(ModelConfigError, match=message):
        await fetcher.get(repo)
    with pytest.raises(ModelConfigError, match=message):
        await fetcher.get(repo)
    assert fetcher.fetches == 1


async def test_the_operator_sizes_hf_models_from_the_hub_config(emulator, hub):
    url, seen = hub
    await add_gpu_node(emulator, "h100", 81559)
    config = dataclasses.replace(FAST_CONFIG, fetch_hf_config=True, hf_endpoint=url)
    async with running_operator(config):
        for name in ("one", "two"):
            await emulator.create(
                ISVC,
                inference_service(name, {"model": {"uri": "hf://meta-llama/Meta-Llama-3-8B", "allowDownload": True}}),
            )
        await emulator.create(
            ISVC, inference_service("gone", {"model": {"uri": "hf://missing/model", "allowDownload": True}})
        )
        for name in ("one", "two"):
            kv = await eventually(lambda: emulator.read(ISVC, "default", name)["status"]["kvCache"])
            assert kv["bytesPerToken"] == 128 * 1024
        sized = await eventually(lambda: condition(emulator.read(ISVC, "default", "gone"), "Sized"))
        assert sized["reason"] == "ModelConfigUnavailable" and "404" in sized["message"]
        assert emulator.read(DEPLOYMENTS, "default", "gone") is None
    assert sum(1 for repo, _, _ in seen if repo == "meta-llama/Meta-Llama-3-8B") == 1
