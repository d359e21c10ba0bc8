"""The autoscaler daemon under the real kopf runtime against the emulated API
server, with engine pods played by HTTP servers on their own loopback
addresses serving /metrics we control: it scales spec.replicas, records an
Event and status.autoscaling, holds on garbage or silent pods, and leaves a
disabled InferenceService alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import pytest
from aiohttp import web

from kubelet_harness import ENGINE_PORT, emulated_cluster, loopback_ip, pod_manifest, running_operator
from pagedinfer.operator.autoscaling_handlers import build_status, is_ready, metrics_url
from pagedinfer.operator.autoscaling_policy import AutoscalerState, MetricSample, Observation, decide
from pagedinfer.operator.autoscaling_spec import parse_autoscaling_spec

NS = "default"


@dataclass
class FakeEngine:
    """An engine pod's /metrics: `mode` is ok, garbage or silent (never answers)."""

    ip: str
    kv_usage: float = 0.0
    mode: str = "ok"

    async def metrics(self, request: web.Request) -> web.Response:
        if self.mode == "garbage":
            return web.Response(text="<html>upstream connect error</html>")
        if self.mode == "silent":
            await asyncio.sleep(30)
        return web.Response(text=f'pagedinfer_kv_cache_usage_ratio{{model_name="m"}} {self.kv_usage}\n'
                                 f'pagedinfer_num_requests_waiting{{model_name="m"}} 0\n')


@contextlib.asynccontextmanager
async def fake_engines(count: int):
    engines, runners = [], []
    try:
        for _ in range(count):
            engine = FakeEngine(loopback_ip({e.ip for e in engines}))
            app = web.Application()
            app.router.add_get("/metrics", engine.metrics)
            runner = web.AppRunner(app, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, engine.ip, ENGINE_PORT).start()
            engines.append(engine)
            runners.append(runner)
        yield engines
    finally:
        for runner in runners:
            await runner.cleanup()


def inference_service(name: str, replicas: int, enabled: bool = True, **autoscaling):
    return {
        "apiVersion": "serving.pagedinfer.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"uri": "hf://tiny/model"}, "replicas": replicas, "minReplicas": 1, "maxReplicas": 3,
            "autoscaling": {
                "enabled": enabled, "intervalSeconds": 0.5, "scrapeTimeoutSeconds": 0.5,
                "metrics": [{"name": "kvCacheUsage", "target": 0.5}],
                "scaleDown": {"stabilizationWindowSeconds": 2}, **autoscaling,
            },
        },
    }


async def wait_for(predicate, timeout_seconds=20.0):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        result = await predicate()
        if result:
            return result
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout_seconds} s")


async def replicas_of(cluster, name):
    return (await cluster.inference_service(NS, name))["spec"]["replicas"]


@pytest.mark.timeout(120)
async def test_scales_up_on_kv_usage_then_down_after_the_window(tmp_path):
    async with emulated_cluster(tmp_path) as cluster, fake_engines(3) as engines, running_operator(cluster, NS):
        await cluster.create_inference_service(NS, inference_service("svc", replicas=1))
        engines[0].kv_usage = 0.9
        await cluster.create_pod(NS, pod_manifest("svc-0", "svc", engines[0].ip))

        async def scaled_to_two():
            return await replicas_of(cluster, "svc") == 2

        await wait_for(scaled_to_two)
        body = await cluster.inference_service(NS, "svc")
        status = body["status"]["autoscaling"]
        assert status["desiredReplicas"] == 2
        assert status["lastScaleReason"].startswith("kvCacheUsage 0.9 above target 0.5: 1 -> 2 replicas")
        assert status["currentMetrics"] == [{"name": "kvCacheUsage", "target": 0.5, "value": 0.9}]
        assert status["lastScaleTime"].endswith("Z")
        events = await wait_for(lambda: _events_with_reason(cluster, "ScaledUp"))
        assert "kvCacheUsage 0.9 above target 0.5" in events[0]["message"]
        assert events[0]["involvedObject"]["name"] == "svc"

        for engine in engines[:2]:
            engine.kv_usage = 0.05
        await cluster.create_pod(NS, pod_manifest("svc-1", "svc", engines[1].ip))

        async def scaled_to_one():
            return await replicas_of(cluster, "svc") == 1

        await wait_for(scaled_to_one)
        status = (await cluster.inference_service(NS, "svc"))["status"]["autoscaling"]
        assert status["lastScaleReason"].startswith("kvCacheUsage 0.05 below target 0.5: 2 -> 1 replicas")


@pytest.mark.timeout(120)
async def test_garbage_and_silent_pods_never_cause_a_scale_down(tmp_path):
    async with emulated_cluster(tmp_path) as cluster, fake_engines(3) as engines, running_operator(cluster, NS):
        await cluster.create_inference_service(NS, inference_service("svc", replicas=3))
        engines[0].kv_usage = 0.05
        engines[1].mode = "garbage"
        engines[2].mode = "silent"
        for i, engine in enumerate(engines):
            await cluster.create_pod(NS, pod_manifest(f"svc-{i}", "svc", engine.ip))

        async def status_written():
            body = await cluster.inference_service(NS, "svc")
            return (body.get("status") or {}).get("autoscaling")

        await wait_for(status_written)
        await asyncio.sleep(4)  # two scale-down windows of rounds: the loop keeps running, holding at 3
        assert await replicas_of(cluster, "svc") == 3
        assert not await _events_with_reason(cluster, "ScaledDown")

        engines[1].mode = engines[2].mode = "ok"
        engines[1].kv_usage = engines[2].kv_usage = 0.05

        async def scaled_down():
            return await replicas_of(cluster, "svc") == 1

        await wait_for(scaled_down)


@pytest.mark.timeout(120)
async def test_disabled_autoscaling_leaves_replicas_to_the_user(tmp_path):
    async with emulated_cluster(tmp_path) as cluster, fake_engines(1) as engines, running_operator(cluster, NS):
        await cluster.create_inference_service(NS, inference_service("svc", replicas=1, enabled=False))
        engines[0].kv_usage = 1.0
        await cluster.create_pod(NS, pod_manifest("svc-0", "svc", engines[0].ip))
        await asyncio.sleep(2)
        body = await cluster.inference_service(NS, "svc")
        assert body["spec"]["replicas"] == 1
        assert "autoscaling" not in (body.get("status") or {})

        await cluster.patch_inference_service(NS, "svc", {"spec": {"autoscaling": {"enabled": True}}})

        async def scaled_up():
            return await replicas_of(cluster, "svc") == 2

        await wait_for(scaled_up)


@pytest.mark.timeout(60)
async def test_an_invalid_autoscaling_spec_is_reported_not_acted_on(tmp_path):
    async with emulated_cluster(tmp_path) as cluster, fake_engines(1) as engines, running_operator(cluster, NS):
        body = inference_service("svc", replicas=1)
        del body["spec"]["maxReplicas"]
        await cluster.create_inference_service(NS, body)
        engines[0].kv_usage = 1.0
        await cluster.create_pod(NS, pod_manifest("svc-0", "svc", engines[0].ip))
        events = await wait_for(lambda: _events_with_reason(cluster, "InvalidAutoscaling"))
        assert "spec.maxReplicas is required" in events[0]["message"]
        assert await replicas_of(cluster, "svc") == 1


async def _events_with_reason(cluster, reason):
    return [e for e in await cluster.events(NS) if e.get("reason") == reason]


def test_only_running_ready_pods_with_an_ip_are_scraped():
    pod = pod_manifest("p", "svc", "10.0.0.7")
    assert is_ready(pod) and metrics_url(pod) == "http://10.0.0.7:8000/metrics"
    assert not is_ready(pod_manifest("p", "svc", "10.0.0.7", ready=False))
    assert not is_ready({**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"}})
    assert not is_ready({**pod, "status": {**pod["status"], "podIP": None}})
    assert metrics_url({**pod, "status": {**pod["status"], "podIP": "fd00::7"}}) == "http://[fd00::7]:8000/metrics"


def test_status_keeps_the_last_scale_until_the_next_change():
    spec = parse_autoscaling_spec(inference_service("svc", 1)["spec"])
    steady = decide(spec, Observation(2, 2, 0, {"kvCacheUsage": MetricSample(0.5, 2)}), AutoscalerState(), 0.0)
    previous = {"lastScaleTime": "2024-01-01T00:00:00Z", "lastScaleReason": "earlier"}
    status = build_status(steady, previous, "2024-01-02T00:00:00Z")
    assert status == {"currentMetrics": [{"name": "kvCacheUsage", "target": 0.5, "value": 0.5}],
                      "desiredReplicas": 2, **previous}
    up = decide(spec, Observation(1, 1, 0, {"kvCacheUsage": MetricSample(1.0, 1)}), AutoscalerState(), 0.0)
    assert build_status(up, previous, "2024-01-02T00:00:00Z")["lastScaleTime"] == "2024-01-02T00:00:00Z"
