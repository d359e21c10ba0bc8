"""The router holds requests while no engine is ready: FIFO with a deadline and a bound, keep-alives for
streams, the demand annotation through the API, 503s that say why."""

from __future__ import annotations

import argparse
import asyncio
import threading

import httpx
import openai
import pytest
from router_harness import route_of, start_router, until
from serving_harness import start_server, stop_server

from pagedinfer.contracts.routing.demand import DEMAND_ANNOTATION
from pagedinfer.engine.kv_events.publisher import KVEventsConfig
from pagedinfer.router.cli import add_parser
from pagedinfer.router.discovery import DiscoverySettings
from pagedinfer.router.hold.demand import DemandTarget
from pagedinfer.router.hold.queue import HoldQueue, HoldSettings, QueueFull
from pagedinfer.testing.operator_harness import inference_service, serving_emulator

NS = "team"
BODY = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_queue_releases_in_arrival_order_refuses_past_its_bound_and_forgets_who_left():
    clock = Clock()
    queue = HoldQueue(HoldSettings(timeout_seconds=30, max_length=3), clock)
    tickets = [queue.enter() for _ in range(3)]
    with pytest.raises(QueueFull, match="3 requests"):
        queue.enter()
    clock.now += 4
    assert queue.oldest_wait_seconds() == 4
    order: list[int] = []

    async def holder(i: int) -> None:
        assert await queue.wait(tickets[i])
        order.append(i)

    waiters = [asyncio.create_task(holder(i)) for i in (2, 0, 1)]  # started out of order
    await asyncio.sleep(0)
    queue.release()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]
    for t in tickets:
        queue.leave(t)
    assert len(queue) == 0 and queue.oldest_wait_seconds() == 0
    late = queue.enter()
    clock.now += 30
    assert queue.expired(late) and not await queue.wait(late)


@pytest.mark.parametrize("flag", ["--queue-timeout-seconds", "--max-queued-requests", "--queue-keepalive-seconds"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_zero_or_negative_queue_bound_is_refused_naming_the_flag(flag, value, capsys):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["router", "--engine", "http://127.0.0.1:8000", flag, value])
    assert f"argument {flag}: must be" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--max-queued-requests"):
        HoldSettings(max_length=0)


def _queue_length(router) -> int:
    return len(router.app.state.hold)


async def test_full_queue_deadline_and_unreachable_api_each_end_in_a_503_that_says_why(tiny_llama):
    """No engine and an API server that cannot be reached: the held request still ends at its deadline, with
    the reason; one more than the queue holds is refused at once; a client that leaves frees its place."""
    target = DemandTarget("llama", NS, api_url="http://127.0.0.1:9")  # nothing listens on the discard port
    router = await asyncio.to_thread(start_router, [], tiny_llama, hold=HoldSettings(1.0, 1), demand=target)
    patient = await asyncio.to_thread(start_router, [], tiny_llama, hold=HoldSettings(300.0, 4))
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            assert (await client.get(router.url + "/health")).json() == {"status": "holding", "queued": 0}
            held = asyncio.create_task(client.post(router.url + "/v1/completions", json=BODY))
            await until(lambda: _queue_length(router) == 1)
            full = await client.post(router.url + "/v1/completions", json=BODY)
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["code"] == "queue_full" and route_of(full)["reason"] == "queue-full"
            assert (await client.get(router.url + "/health")).status_code == 503
            metrics = (await client.get(router.url + "/metrics")).text
            assert "pagedinfer_router_queue_length 1.0" in metrics
            assert "pagedinfer_router_queue_oldest_wait_seconds" in metrics
            late = await held
            assert late.status_code == 503 and late.headers["retry-after"] == "1"
            error = late.json()["error"]
            assert error["code"] == "no_engine" and "waited 1 s" in error["message"]
            assert "cannot reach the Kubernetes API" in error["message"] and "ConnectError" in error["message"]
            assert _queue_length(router) == 0

            with pytest.raises(httpx.ReadTimeout):  # the client gives up: its place is freed long before 300 s
                await client.post(patient.url + "/v1/completions", json=BODY, timeout=httpx.Timeout(60, read=0.5))
            await until(lambda: _queue_length(patient) == 0)
    finally:
        await asyncio.to_thread(router.stop)
        await asyncio.to_thread(patient.stop)


def _slice(port: int) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "addressType": "IPv4",
        "metadata": {"name": "a", "namespace": NS, "labels": {"kubernetes.io/service-name": "llama-engines"}},
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
    }


def _router_rights(access) -> bool:
    """The router's Role: list EndpointSlices; get and patch its own InferenceService, nothing else."""
    if (access.group, access.resource, access.verb) == ("discovery.k8s.io", "endpointslices", "list"):
        return access.namespace == NS
    return (access.group, access.resource, access.namespace, access.name) == (
        "serving.pagedinfer.dev",
        "inferenceservices",
        NS,
        "llama",
    ) and access.verb in ("get", "patch")


async def test_held_requests_signal_demand_keep_streams_alive_and_complete_once_an_engine_appears(tiny_llama):
    engine = await asyncio.to_thread(start_server, tiny_llama, kv_events=KVEventsConfig(port=0))
    async with serving_emulator(authorizer=_router_rights) as (emulator, api_url):
        isvcs = next(r for r in emulator.resources if r.plural == "inferenceservices")
        await emulator.create(isvcs, inference_service("llama", {"model": {"uri": "hf://org/tiny"}}, NS))
        slices = emulator.register("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
        router = await asyncio.to_thread(
            start_router,
            [],
            tiny_llama,
            "prefix",
            None,
            DiscoverySettings("llama-engines", NS, api_url=api_url, poll_interval_seconds=0.2),
            hold=HoldSettings(120.0, 8, keepalive_seconds=0.2),
            demand=DemandTarget("llama", NS, api_url),
        )
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        streamed: dict = {}
        headers_came = threading.Event()

        def openai_stream() -> None:
            raw = client.completions.with_raw_response.create(
                model="tiny", prompt="Once upon", max_tokens=4, stream=True
            )
            streamed["route"] = route_of(raw)
            headers_came.set()
            streamed["chunks"] = list(raw.parse())

        try:
            async with httpx.AsyncClient(timeout=120) as http:
                plain = asyncio.create_task(http.post(router.url + "/v1/completions", json=BODY))
                stream = asyncio.create_task(asyncio.to_thread(openai_stream))
                async with http.stream("POST", router.url + "/v1/completions", json={**BODY, "stream": True}) as r:
                    assert r.status_code == 200 and route_of(r)["reason"] == "held"
                    lines = r.aiter_lines()
                    assert await anext(lines) == ": keep-alive"
                    await until(lambda: _queue_length(router) == 3)
                    await until(
                        lambda: (
                            DEMAND_ANNOTATION
                            in (emulator.read(isvcs, NS, "llama")["metadata"].get("annotations") or {})
                        )
                    )
                    assert "queue_length 3.0" in (await http.get(router.url + "/metrics")).text
                    await asyncio.to_thread(headers_came.wait, 60)
                    assert streamed["route"]["reason"] == "held"

                    await emulator.create(slices, _slice(int(engine.url.rsplit(":", 1)[1])))
                    rest = [line async for line in lines if line and line != ": keep-alive"]
                assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2].replace(" ", "")
                done = await plain
                assert done.status_code == 200 and route_of(done)["engine"] == engine.url
                await stream
                assert streamed["chunks"][-1].choices[0].finish_reason == "length"
                await until(lambda: _queue_length(router) == 0)  # each left (a stream's once its body ended)
        finally:
            await asyncio.to_thread(router.stop)
            await asyncio.to_thread(stop_server, engine)
    stamp = emulator.read(isvcs, NS, "llama")["metadata"]["annotations"][DEMAND_ANNOTATION]
    assert stamp.endswith("Z") and "T" in stamp
    assert emulator.calls and all(code == 200 for _, code in emulator.calls)  # within the Role's rights
