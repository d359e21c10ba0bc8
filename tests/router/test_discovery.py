"""In a cluster the router follows the ready endpoints of the engines' Service, with namespace-scoped rights."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from router_harness import route_of, start_router, until

from pagedinfer.router.discovery import DiscoverySettings, engine_endpoints, ready_engine_urls
from pagedinfer.testing.operator_harness import serving_emulator

NS = "team"


def _slice(name: str, port: int, *conditions: dict, address: str = "127.0.0.1") -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "addressType": "IPv4",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": "llama-engines"}},
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": c} for c in conditions],
    }


@pytest.mark.parametrize(
    "conditions, ready",
    [
        ({"ready": True, "serving": True, "terminating": False}, True),
        ({}, True),  # absent: ready, as the API documents
        ({"ready": False}, False),  # not ready yet
        ({"ready": True, "terminating": True}, False),  # still serving, but going: no new requests
    ],
)
def test_only_ready_endpoints_that_are_not_terminating_count(conditions, ready):
    urls = ready_engine_urls([_slice("s", 8000, conditions, address="10.0.0.7")])
    assert urls == (["http://10.0.0.7:8000"] if ready else [])


def test_a_not_ready_endpoint_naming_its_pod_is_pending_and_a_terminating_one_neither():
    s = _slice(
        "s",
        8000,
        {"ready": True},
        {"ready": False, "serving": False, "terminating": False},  # waits on its readiness gate
        {"ready": False, "serving": True, "terminating": True},  # going
        {"ready": False},  # no targetRef: nothing to mark
    )
    for endpoint, (ip, pod) in zip(s["endpoints"], [("10.0.0.1", "a"), ("10.0.0.2", "b"), ("10.0.0.3", "c")]):
        endpoint.update(addresses=[ip], targetRef={"kind": "Pod", "name": pod, "namespace": NS})
    s["endpoints"][3]["addresses"] = ["10.0.0.4"]
    found = engine_endpoints([s])
    assert found.ready == ["http://10.0.0.1:8000"] and found.pending == {"http://10.0.0.2:8000": "b"}


def test_the_port_is_the_named_one_and_ipv6_addresses_are_bracketed():
    s = _slice("s", 8000, {"ready": True}, address="fd00::7")
    s["ports"] = [{"name": "metrics", "port": 9000}, {"name": "http", "port": 8000}]
    assert ready_engine_urls([s]) == ["http://[fd00::7]:8000"]


def _allowed(access) -> bool:
    return (access.group, access.resource, access.namespace, access.verb) == (
        "discovery.k8s.io",
        "endpointslices",
        NS,
        "list",
    )


async def test_a_new_ready_engine_gets_traffic_and_a_terminating_one_none(engines, tiny_llama):
    async with serving_emulator(authorizer=_allowed) as (emulator, api_url):
        slices = emulator.register("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
        port_a, port_b = (int(e.url.rsplit(":", 1)[1]) for e in engines)
        await emulator.create(slices, _slice("a", port_a, {"ready": True}))
        router = await asyncio.to_thread(
            start_router, [], tiny_llama, "round-robin", None, DiscoverySettings("llama-engines", NS, api_url=api_url)
        )
        try:
            state = router.app.state.router
            await until(lambda: [e.url for e in state.engines.values() if e.healthy] == [engines[0].url])

            await emulator.create(slices, _slice("b", port_b, {"ready": False}))
            await emulator.merge(
                slices, NS, "b", {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}
            )
            await until(lambda: sum(e.healthy for e in state.engines.values()) == 2)
            chosen = set()
            async with httpx.AsyncClient() as client:
                for _ in range(4):
                    r = await client.post(
                        router.url + "/v1/completions",
                        timeout=60,
                        json={"model": "tiny", "prompt": "hi", "max_tokens": 1},
                    )
                    chosen.add(route_of(r)["engine"])
                assert chosen == {engines[0].url, engines[1].url}

                await emulator.merge(
                    slices,
                    NS,
                    "a",
                    {
                        "endpoints": [
                            {
                                "addresses": ["127.0.0.1"],
                                "conditions": {"ready": False, "serving": True, "terminating": True},
                            }
                        ]
                    },
                )
                await until(lambda: engines[0].url not in state.engines)
                for _ in range(4):
                    r = await client.post(
                        router.url + "/v1/completions",
                        timeout=60,
                        json={"model": "tiny", "prompt": "hi", "max_tokens": 1},
                    )
                    assert route_of(r)["engine"] == engines[1].url
        finally:
            await asyncio.to_thread(router.stop)
        assert emulator.calls and all(code == 200 for _, code in emulator.calls)  # namespace-scoped list only
