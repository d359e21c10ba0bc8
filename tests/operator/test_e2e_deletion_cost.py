"""Cache-preserving scale-in: before the autoscaler lowers spec.replicas it marks each engine pod with the
prefix-cache hits it served, and a ReplicaSet scaling down (played by the emulator's `scale_down_pods`,
which orders pods as the ReplicaSet controller does) removes the coldest pod.

The coldest pod is the oldest and first-named, so the controller's fallback order (newest first) would
keep it: only the deletion cost makes it go.
"""

import kmock
import pytest
from fake_engine_metrics import fake_engines

from pagedinfer.operator.autoscaling.readings import PodReading
from pagedinfer.operator.children.labels import selector_labels
from pagedinfer.operator.routing.deletion_cost import DELETION_COST_ANNOTATION, INT32_MAX, deletion_costs
from pagedinfer.testing.kube_emulator_rules import scale_down_order
from pagedinfer.testing.kubelet_harness import add_ready_pod, pod_manifest
from pagedinfer.testing.operator_harness import ISVC, eventually, running_operator

pytestmark = pytest.mark.timeout(120)
NS = "default"
PODS = kmock.resource("", "v1", "pods")


def test_costs_are_the_hit_tokens_of_the_last_interval_clamped_and_zero_when_unknown():
    readings = {
        "hot": PodReading(0.1, 0, 900.0, 640.4),
        "cold": PodReading(0.1, 0, 10.0, 2.0),
        "first-scrape": PodReading(0.1, 0, None, None),
        "failed": None,
        "huge": PodReading(0.1, 0, 1e12, 1e12),
    }
    assert deletion_costs(readings) == {"hot": 640, "cold": 2, "first-scrape": 0, "failed": 0, "huge": INT32_MAX}


def pod(name, cost=None, ready=True, created="2026-12-01T00:00:00Z"):
    meta = {
        "name": name,
        "creationTimestamp": created,
        "annotations": {} if cost is None else {DELETION_COST_ANNOTATION: str(cost)},
    }
    return {
        "metadata": meta,
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_the_emulated_replica_set_deletes_unready_then_cheapest_then_newest():
    pods = [
        pod("old-hot", 50, created="2026-12-01T00:00:00Z"),
        pod("new-hot", 50, created="2026-12-01T00:00:09Z"),
        pod("cold", 1),
        pod("unready", 99, ready=False),
        pod("uncosted-new", created="2026-12-01T00:00:05Z"),
    ]
    assert [p["metadata"]["name"] for p in scale_down_order(pods)] == [
        "unready",
        "uncosted-new",
        "cold",
        "new-hot",
        "old-hot",
    ]


async def test_scaling_in_removes_the_engine_whose_cache_serves_the_fewest_hits(emulator):
    spec = {
        "resources": {"gpus": 0},
        "replicas": 3,
        "minReplicas": 1,
        "maxReplicas": 3,
        "router": {"enabled": False},
        "autoscaling": {
            "enabled": True,
            "intervalSeconds": 0.3,
            "scrapeTimeoutSeconds": 0.5,
            "metrics": [{"name": "kvCacheUsage", "target": 0.5}],
            "scaleDown": {
                "stabilizationWindowSeconds": 1,
                "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
            },
        },
    }
    async with fake_engines(3) as engines, running_operator():
        for engine, hits in zip(engines, (5.0, 400.0, 300.0)):
            engine.kv_usage, engine.hit_tokens_per_scrape = 0.1, hits
        await emulator.create(
            ISVC,
            {
                "apiVersion": "serving.pagedinfer.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": "svc", "namespace": NS},
                "spec": spec,
            },
        )
        for name, engine in zip(("svc-a", "svc-b", "svc-c"), engines):  # svc-a: the oldest and the coldest
            await add_ready_pod(emulator, NS, pod_manifest(name, "svc", engine.ip))
        await eventually(lambda: emulator.read(ISVC, NS, "svc")["spec"]["replicas"] == 2, timeout_seconds=30)
    costs = {
        p["metadata"]["name"]: int(p["metadata"]["annotations"][DELETION_COST_ANNOTATION])
        for p in emulator.read_all(PODS, NS)
    }
    assert costs["svc-a"] < min(costs["svc-b"], costs["svc-c"])
    # Playing the Deployment's ReplicaSet: it scales down to the new spec.replicas.
    assert await emulator.scale_down_pods(NS, selector_labels("svc"), 2) == ["svc-a"]
