"""End to end with REAL engines: the full operator (reconciler + autoscaler) under
kopf against the emulated API server; the kubelet harness runs, per replica
of the Deployment the operator made, one process of the Deployment's own
container command line (`pagedinfer serve` with the operator's flags: no
--model, so the engine's embedded default model; a 32-block KV pool and a
256-token max_model_len from the spec) on 127.0.0.2, 127.0.0.3, ... port
8000; a load generator plays the clients. KV usage climbing scales up within
two autoscaler intervals, idling scales down after the window, and a prefix
working set larger than one pod's cache (hit rate below target) scales up
while the pool is past its KV target."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import aiohttp
import pytest
from autoscaler_rounds import AutoscalerRounds
from prometheus_client.parser import text_string_to_metric_families

from pagedinfer.operator.autoscaling import daemon  # noqa: F401  (registers the daemon)
from pagedinfer.testing.kubelet_harness import KubeletHarness, LoadGenerator
from pagedinfer.testing.operator_harness import DEPLOYMENTS, EVENTS, ISVC, eventually, running_operator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NS = "default"
INTERVAL_SECONDS = 1.0
NUM_GPU_BLOCKS = 32
MAX_MODEL_LEN = 256
KV_TARGET = 0.5
TOLERANCE = 0.1


def inference_service(metrics, scale_down_window_seconds=6):
    """A CPU engine (gpus: 0) with the engine's embedded model (no model.uri) and a small KV pool."""
    return {
        "apiVersion": "serving.pagedinfer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "tiny", "namespace": NS},
        "spec": {
            "resources": {"gpus": 0},
            "engine": {"numGpuBlocksOverride": NUM_GPU_BLOCKS, "maxModelLen": MAX_MODEL_LEN, "blockSize": 16},
            "replicas": 1,
            "minReplicas": 1,
            "maxReplicas": 3,
            # The router is on (maxReplicas > 1) but not run here: no warm-up, so no readiness gate to open.
            "router": {"warmup": {"prefixes": 0}},
            "autoscaling": {
                "enabled": True,
                "intervalSeconds": INTERVAL_SECONDS,
                "tolerance": TOLERANCE,
                "scrapeTimeoutSeconds": 2,
                "metrics": metrics,
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 2}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": scale_down_window_seconds,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 2}],
                },
            },
        },
    }


@contextlib.asynccontextmanager
async def cluster_with_engines(emulator, tmp_path, prompt_of, **load):
    """Harness and load generator start before kopf (which, exiting, cancels the
    tasks it finds were created after it); the load generator stops before it
    exits. Every wait inside watches the operator and the engines: one that
    ends unexpectedly fails it at once."""
    harness = KubeletHarness(emulator, NS, "tiny", tmp_path, max_engines=3)
    generator = LoadGenerator(harness, prompt_of, **load)
    stop = asyncio.Event()
    async with harness.running():
        task = asyncio.create_task(generator.run(stop))
        try:
            async with running_operator():
                try:
                    yield harness, generator
                finally:
                    stop.set()
                    await task
        finally:
            stop.set()
            await asyncio.gather(task, return_exceptions=True)


def replicas(emulator):
    return emulator.read(ISVC, NS, "tiny")["spec"]["replicas"]


def scale_reason(emulator):
    return ((emulator.read(ISVC, NS, "tiny").get("status") or {}).get("autoscaling") or {}).get("lastScaleReason")


async def engine_facts(url):
    """(KV blocks in the pool from /metrics, served model id and max_model_len from /v1/models)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
        async with session.get(f"{url}/v1/models") as response:
            model = (await response.json())["data"][0]
    blocks = next(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "pagedinfer_kv_cache_num_blocks"
    )
    return blocks, model["id"], model["max_model_len"]


async def test_kv_usage_scales_up_within_two_intervals_and_back_down_when_idle(emulator, tmp_path):
    await emulator.create(ISVC, inference_service([{"name": "kvCacheUsage", "target": KV_TARGET}]))
    rounds = AutoscalerRounds(emulator, NS, "tiny").install()
    distinct = lambda i: f"request {i}: tell a long story about block {i * 7919 % 1000}"  # noqa: E731
    async with cluster_with_engines(emulator, tmp_path, distinct, concurrency=4, max_tokens=160) as (harness, load):
        await eventually(lambda: len(harness.engines) == 1, timeout_seconds=120)
        args = emulator.read(DEPLOYMENTS, NS, "tiny")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--model" not in args
        assert list(harness.engines[0].process.args[1:]) == [harness.ips[0] if a == "0.0.0.0" else a for a in args]
        assert await engine_facts(harness.urls[0]) == (NUM_GPU_BLOCKS, "tiny", MAX_MODEL_LEN)
        idle_rounds = len(rounds.rounds)
        await eventually(lambda: len(rounds.rounds) >= idle_rounds + 3, timeout_seconds=30)
        assert replicas(emulator) == 1  # an idle engine: no reason to scale

        load.active.set()
        await eventually(lambda: rounds.first(lambda r: r.desired_replicas >= 2) is not None, timeout_seconds=60)
        # Usage within the tolerance of the target (0.5 < usage <= 0.55) calls for no change, by the spec.
        above = rounds.first(lambda r: (r.metrics.get("kvCacheUsage") or 0.0) > KV_TARGET * (1 + TOLERANCE))
        scaled = rounds.first(lambda r: r.desired_replicas >= 2)
        trace = [(r.metrics.get("kvCacheUsage"), r.desired_replicas) for r in rounds.rounds]
        print(f"(KV usage, desired replicas) per autoscaler round: {trace}")
        assert above is not None and above <= scaled <= above + 2, (
            f"no scale-up within two intervals of KV usage first above target; (usage, desired) per round: {trace}"
        )
        reason = await eventually(lambda: scale_reason(emulator))
        assert reason.startswith("kvCacheUsage") and f"above target {KV_TARGET}: 1 -> 2 replicas" in reason, reason
        await eventually(lambda: emulator.read(DEPLOYMENTS, NS, "tiny")["spec"]["replicas"] >= 2)
        await eventually(lambda: len(harness.engines) >= 2, timeout_seconds=120)
        assert await engine_facts(harness.urls[1]) == (NUM_GPU_BLOCKS, "tiny", MAX_MODEL_LEN)
        assert load.num_completed > 0

        load.active.clear()
        idle_since = time.monotonic()
        await eventually(lambda: replicas(emulator) == 1, timeout_seconds=90)
        print(f"scale-down to 1 replica {time.monotonic() - idle_since:.1f} s after the load stopped")
        await eventually(lambda: f"below target {KV_TARGET}" in scale_reason(emulator))
        await eventually(lambda: len(harness.engines) == 1, timeout_seconds=60)


async def test_a_low_hit_rate_scales_up_only_while_the_pool_is_under_pressure(emulator, tmp_path):
    """24 prefixes of ~4 blocks each (about 100 blocks) cycle through a 32-block
    pool: least-recently-used eviction keeps none of them long enough to hit.
    First with a KV target of 1.0, which usage can never exceed: the hit rate,
    far below its target, abstains round after round and nothing scales (the
    runaway this rule prevents). Then the KV target drops to 0.1 (one running
    request fills more): under pressure the hit rate of ~0 asks for as many
    replicas as allowed, more than KV usage alone, and the reason names it."""
    metrics = lambda kv_target: [
        {"name": "prefixCacheHitRate", "target": 0.5},  # noqa: E731
        {"name": "kvCacheUsage", "target": kv_target},
    ]
    await emulator.create(ISVC, inference_service(metrics(1.0)))
    rounds = AutoscalerRounds(emulator, NS, "tiny").install()
    prefixes = [" ".join(f"doc{p}-word{w}" for w in range(12)) for p in range(24)]
    cycling = lambda i: f"{prefixes[i % len(prefixes)]} question {i}"  # noqa: E731

    def hit_rate_scale_ups():
        return [
            e["message"]
            for e in emulator.read_all(EVENTS)
            if e.get("reason") == "ScaledUp" and e.get("message", "").startswith("prefixCacheHitRate")
        ]

    async with cluster_with_engines(emulator, tmp_path, cycling, concurrency=2, max_tokens=4) as (harness, load):
        await eventually(lambda: len(harness.engines) == 1, timeout_seconds=120)
        load.active.set()
        low = lambda r: (
            (
                r.metrics.get("prefixCacheHitRate")
                if r.metrics.get("prefixCacheHitRate") is not None  # noqa: E731
                else 1.0
            )
            < 0.5
        )
        await eventually(lambda: sum(map(low, rounds.rounds)) >= 5, timeout_seconds=60)
        trace = [(r.metrics, r.desired_replicas) for r in rounds.rounds]
        assert all(r.desired_replicas == 1 for r in rounds.rounds) and replicas(emulator) == 1, trace

        await emulator.merge(ISVC, NS, "tiny", {"spec": {"autoscaling": {"metrics": metrics(0.1)}}})
        (reason, *_) = await eventually(hit_rate_scale_ups, timeout_seconds=60)
        assert re.match(r"prefixCacheHitRate [0-9.e-]+ below target 0\.5: 1 -> 2 replicas", reason), reason
        assert "capped at maxReplicas 3" in reason, reason
        load.active.clear()
