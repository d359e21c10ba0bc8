"""Scraping real HTTP endpoints on 127.0.0.1: good pods are read, slow,
broken or lying pods fail alone and never raise; concurrency is bounded.
The Prometheus source's queries are parsed and evaluated as PromQL."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import promql_parser
import pytest
from aiohttp import web
from prometheus_api import PrometheusApi

from pagedinfer.operator.autoscaling.readings import PodReading, PodScrape
from pagedinfer.operator.autoscaling.scrape import PodTarget, pod_selector, query_prometheus, scrape_pods

GOOD = """# HELP pagedinfer_kv_cache_usage_ratio Used KV cache blocks / total blocks (0-1).
# TYPE pagedinfer_kv_cache_usage_ratio gauge
pagedinfer_kv_cache_usage_ratio{model_name="tiny"} 0.75
# TYPE pagedinfer_num_requests_waiting gauge
pagedinfer_num_requests_waiting{model_name="tiny"} 2.0
# TYPE pagedinfer_prefix_cache_queries counter
pagedinfer_prefix_cache_queries_total{model_name="tiny"} 1200.0
# TYPE pagedinfer_prefix_cache_hits counter
pagedinfer_prefix_cache_hits_total{model_name="tiny"} 300.0
"""

POD_A, POD_B = "llama-7d9f8-abcde", "llama.v2-5c6b7-fghij"


def twice(pod, value):
    """One pod scraped by two jobs (a PodMonitor and the annotation job): two series, one reading."""
    return [({"namespace": "ns", "pod": pod, "job": job}, value) for job in ("podmonitor", "annotations")]


SERIES = {
    "pagedinfer_kv_cache_usage_ratio": twice(POD_A, 0.5)
    + twice(POD_B, 0.9)
    + [({"namespace": "ns", "pod": "llamaxv2-5c6b7-fghij"}, 0.1), ({"namespace": "other", "pod": POD_A}, 0.2)],
    "pagedinfer_num_requests_waiting": twice(POD_A, 1) + twice(POD_B, 3),
    "pagedinfer_prefix_cache_queries_total": twice(POD_A, 100),
    "pagedinfer_prefix_cache_hits_total": twice(POD_A, 25),
}


class Pods:
    """An aiohttp server whose paths play engine pods in various states."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.prometheus = PrometheusApi(SERIES)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/good/metrics", self.good)
        app.router.add_get("/slow/metrics", self.slow)
        app.router.add_get("/garbage/metrics", self.fixed(200, "<html>oops</html>"))
        app.router.add_get("/error/metrics", self.fixed(500, "boom"))
        app.router.add_get("/redirect/metrics", self.redirect)
        app.router.add_get("/huge/metrics", self.fixed(200, "# " + "x" * (5 << 20) + "\n"))
        app.router.add_get("/paced/{i}/metrics", self.paced)
        app.router.add_get("/api/v1/query", self.prometheus.handle)
        app.router.add_get("/broken/api/v1/query", self.fixed(400, '{"status": "error", "error": "parse error"}'))
        return app

    @staticmethod
    def fixed(status, text):
        async def handler(request):
            return web.Response(status=status, text=text)

        return handler

    async def redirect(self, request):
        raise web.HTTPFound("/good/metrics")

    async def good(self, request):
        return web.Response(text=GOOD, content_type="text/plain")

    async def slow(self, request):
        await asyncio.sleep(2)
        return web.Response(text=GOOD)

    async def paced(self, request):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.1)
        self.in_flight -= 1
        return web.Response(text=GOOD)


@pytest.fixture
async def pods():
    state = Pods()
    runner = web.AppRunner(state.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state.base_url = f"http://127.0.0.1:{port}"
    yield state
    await runner.cleanup()


def target(pods, name):
    return PodTarget(name, f"{pods.base_url}/{name}/metrics")


async def test_each_pod_fails_alone(pods):
    names = ["good", "slow", "garbage", "error", "redirect", "huge"]
    async with aiohttp.ClientSession() as session:
        results = await scrape_pods(session, [target(pods, n) for n in names], timeout_seconds=0.5, concurrency=8)
    assert results["good"] == PodScrape(0.75, 2.0, 1200.0, 300.0)
    assert {n for n, r in results.items() if r is None} == set(names) - {"good"}


async def test_a_refused_connection_is_a_failed_scrape():
    async with aiohttp.ClientSession() as session:
        results = await scrape_pods(session, [PodTarget("gone", "http://127.0.0.1:9/metrics")], 0.5, 1)
    assert results == {"gone": None}


async def test_concurrency_is_bounded(pods):
    targets = [PodTarget(f"p{i}", f"{pods.base_url}/paced/{i}/metrics") for i in range(6)]
    async with aiohttp.ClientSession() as session:
        results = await scrape_pods(session, targets, timeout_seconds=5, concurrency=2)
    assert all(r is not None for r in results.values())
    assert pods.max_in_flight == 2


async def test_bad_arguments_are_named():
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ValueError, match="timeout_seconds"):
            await scrape_pods(session, [], 0, 1)
        with pytest.raises(ValueError, match="concurrency"):
            await scrape_pods(session, [], 1, 0)
    with pytest.raises(ValueError, match="metrics_url"):
        PodTarget("p", "file:///etc/passwd")


async def test_prometheus_source_reads_per_pod_series(pods):
    async with aiohttp.ClientSession() as session:
        readings = await query_prometheus(session, pods.base_url, "ns", [POD_A, POD_B], 15, 2)
    assert readings[POD_A] == PodReading(0.5, 1.0, 100.0, 25.0)  # two jobs' series: one reading, not their sum
    assert readings[POD_B] == PodReading(0.9, 3.0, None, None)
    assert len(pods.prometheus.queries) == 4 and all("[15s]" in q for q in pods.prometheus.queries if "increase" in q)


def test_the_pod_selector_is_a_promql_regex_that_matches_exactly_the_pods():
    names = [POD_A, POD_B, "a.b.c"]
    expr = promql_parser.parse(f"up{pod_selector('ns', names)}")
    matchers = {m.name: m for m in expr.matchers.matchers}
    assert matchers["namespace"].value == "ns"
    regex = matchers["pod"].value  # the regex Prometheus compiles, after the PromQL string's escapes
    assert regex == r"llama-7d9f8-abcde|llama\.v2-5c6b7-fghij|a\.b\.c"
    assert all(re.fullmatch(regex, n) for n in names)
    assert not any(re.fullmatch(regex, n) for n in ["llamaxv2-5c6b7-fghij", "axbxc", "llama-7d9f8-abcd", "x" + POD_A])


def test_re_escape_is_not_a_promql_string():
    with pytest.raises(ValueError, match="unknown escape sequence"):
        promql_parser.parse(f'up{{pod=~"{re.escape(POD_A)}"}}')


async def test_prometheus_failure_fails_every_pod(pods):
    async with aiohttp.ClientSession() as session:
        readings = await query_prometheus(session, f"{pods.base_url}/broken", "ns", [POD_A], 15, 2)
        unreachable = await query_prometheus(session, "http://127.0.0.1:9", "ns", [POD_A], 15, 2)
    assert readings == {POD_A: None} and unreachable == {POD_A: None}


async def test_prometheus_refuses_names_that_would_change_the_query(pods):
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ValueError, match="DNS names"):
            await query_prometheus(session, pods.base_url, "ns", ['a"} or vector(1)'], 15, 2)
