"""End to end with REAL engines: the full operator (reconciler + autoscaler) under
kopf against the emulated API server; the kubelet harness runs one real
`pagedinfer serve` process (tiny model, a 32-block KV pool) per replica of the
Deployment, on 127.0.0.2, 127.0.0.3, ... port 8000; a load generator plays the
clients. KV usage climbing scales up, idling scales down after the window, and
a prefix working set larger than one pod's cache (hit rate below target)
scales up."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from kubelet_harness import KubeletHarness, LoadGenerator
from operator_harness import DEPLOYMENTS, ISVC, eventually, running_operator
from pagedinfer.operator import autoscaling_handlers  # noqa: F401  (registers the daemon)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NS = "default"
INTERVAL_SECONDS = 1.0
ENGINE_ARGS = ("--num-gpu-blocks-override", "32", "--max-model-len", "256", "--block-size", "16")


def inference_service(metrics, scale_down_window_seconds=6):
    return {
        "apiVersion": "serving.pagedinfer.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "tiny", "namespace": NS},
        "spec": {
            "resources": {"gpus": 0}, "replicas": 1, "minReplicas": 1, "maxReplicas": 3,
            "autoscaling": {
                "enabled": True, "intervalSeconds": INTERVAL_SECONDS, "scrapeTimeoutSeconds": 2,
                "metrics": metrics,
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 2}]},
                "scaleDown": {"stabilizationWindowSeconds": scale_down_window_seconds,
                              "policies": [{"type": "Pods", "value": 2, "periodSeconds": 2}]},
            },
        },
    }


@contextlib.asynccontextmanager
async def cluster_with_engines(emulator, model_dir, tmp_path, prompt_of, **load):
    """Harness and load generator start before kopf (which, exiting, cancels the
    tasks it finds were created after it) and stop before it exits."""
    harness = KubeletHarness(emulator, NS, "tiny", model_dir, tmp_path, engine_args=ENGINE_ARGS, max_engines=3)
    generator = LoadGenerator(harness, prompt_of, **load)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(harness.run(stop)), asyncio.create_task(generator.run(stop))]
    try:
        async with running_operator():
            try:
                yield harness, generator
            finally:
                stop.set()
                await asyncio.gather(*tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def replicas(emulator):
    return emulator.read(ISVC, NS, "tiny")["spec"]["replicas"]


def scale_reason(emulator):
    return ((emulator.read(ISVC, NS, "tiny").get("status") or {}).get("autoscaling") or {}).get("lastScaleReason")


async def test_kv_usage_scales_up_under_load_and_back_down_when_idle(emulator, make_model, tmp_path):
    await emulator.create(ISVC, inference_service([{"name": "kvCacheUsage", "target": 0.5}]))
    distinct = lambda i: f"request {i}: tell a long story about block {i * 7919 % 1000}"  # noqa: E731
    async with cluster_with_engines(emulator, make_model("llama"), tmp_path, distinct, concurrency=4,
                                    max_tokens=160) as (harness, load):
        await eventually(lambda: len(harness.engines) == 1, timeout_seconds=120)
        await asyncio.sleep(3 * INTERVAL_SECONDS)
        assert replicas(emulator) == 1  # idle engine: no reason to scale

        load.active.set()
        started = time.monotonic()
        await eventually(lambda: replicas(emulator) >= 2, timeout_seconds=60)
        print(f"scale-up decision {time.monotonic() - started:.1f} s after the load started")
        reason = await eventually(lambda: scale_reason(emulator))  # written just after the scale patch
        assert reason.startswith("kvCacheUsage") and "above target 0.5: 1 -> 2 replicas" in reason, reason
        await eventually(lambda: emulator.read(DEPLOYMENTS, NS, "tiny")["spec"]["replicas"] >= 2)
        await eventually(lambda: len(harness.engines) >= 2, timeout_seconds=120)
        assert load.num_completed > 0

        load.active.clear()
        idle_since = time.monotonic()
        await eventually(lambda: replicas(emulator) == 1, timeout_seconds=90)
        idle_seconds = time.monotonic() - idle_since
        print(f"scale-down to 1 replica {idle_seconds:.1f} s after the load stopped")
        await eventually(lambda: "below target 0.5" in scale_reason(emulator))
        await eventually(lambda: len(harness.engines) == 1, timeout_seconds=60)


async def test_a_hit_rate_below_target_scales_up(emulator, make_model, tmp_path):
    """24 prefixes of ~5 blocks each (about 120 blocks) cycle through a 32-block
    pool: least-recently-used eviction keeps none of them long enough to hit."""
    await emulator.create(ISVC, inference_service([{"name": "prefixCacheHitRate", "target": 0.5}]))
    prefixes = [" ".join(f"doc{p}-word{w}" for w in range(12)) for p in range(24)]
    cycling = lambda i: f"{prefixes[i % len(prefixes)]} question {i}"  # noqa: E731
    async with cluster_with_engines(emulator, make_model("llama"), tmp_path, cycling, concurrency=2,
                                    max_tokens=4) as (harness, load):
        await eventually(lambda: len(harness.engines) == 1, timeout_seconds=120)
        load.active.set()
        await eventually(lambda: replicas(emulator) >= 2, timeout_seconds=60)
        reason = await eventually(lambda: scale_reason(emulator))
        assert reason.startswith("prefixCacheHitRate") and "below target 0.5" in reason, reason
        load.active.clear()
