"""The autoscaler daemon under the real kopf runtime against the emulated API
server, with engine pods played by HTTP servers on their own loopback
addresses serving /metrics we control: it scales spec.replicas, records an
Event and status.autoscaling, holds on garbage or silent pods, and leaves a
disabled InferenceService alone."""

from __future__ import annotations

import pytest
from fake_engine_metrics import fake_engines

from pagedinfer.operator.autoscaling import daemon  # noqa: F401  (registers the daemon)
from pagedinfer.operator.autoscaling.daemon import build_status, is_ready, metrics_url
from pagedinfer.operator.autoscaling.policy import AutoscalerState, MetricSample, Observation, decide
from pagedinfer.operator.autoscaling.spec import parse_autoscaling_spec
from pagedinfer.testing.kubelet_harness import add_ready_pod, pod_manifest
from pagedinfer.testing.operator_harness import DEPLOYMENTS, EVENTS, ISVC, condition, eventually, running_operator

NS = "default"


def inference_service(name: str, replicas: int, enabled: bool = True, **autoscaling):
    return {
        "apiVersion": "serving.pagedinfer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "resources": {"gpus": 0},
            "replicas": replicas,
            "minReplicas": 1,
            "maxReplicas": 3,
            "autoscaling": {
                "enabled": enabled,
                "intervalSeconds": 0.5,
                "scrapeTimeoutSeconds": 0.5,
                "metrics": [{"name": "kvCacheUsage", "target": 0.5}],
                "scaleDown": {"stabilizationWindowSeconds": 2},
                **autoscaling,
            },
        },
    }


def replicas_of(emulator, name="svc"):
    return emulator.read(ISVC, NS, name)["spec"]["replicas"]


def autoscaling_status(emulator, name="svc"):
    return ((emulator.read(ISVC, NS, name) or {}).get("status") or {}).get("autoscaling")


def events_with_reason(emulator, reason):
    return [e for e in emulator.read_all(EVENTS, NS) if e.get("reason") == reason]


@pytest.mark.timeout(120)
async def test_scales_up_on_kv_usage_then_down_after_the_window(emulator):
    async with fake_engines(3) as engines, running_operator():
        await emulator.create(ISVC, inference_service("svc", replicas=1))
        engines[0].kv_usage = 0.9
        await add_ready_pod(emulator, NS, pod_manifest("svc-0", "svc", engines[0].ip))

        await eventually(lambda: replicas_of(emulator) == 2)
        # spec.replicas (the scale subresource) is written before status: wait for both
        status = await eventually(
            lambda: (autoscaling_status(emulator) or {}).get("desiredReplicas") == 2 and autoscaling_status(emulator)
        )
        assert status["desiredReplicas"] == 2
        assert status["lastScaleReason"].startswith("kvCacheUsage 0.9 above target 0.5: 1 -> 2 replicas")
        assert status["currentMetrics"] == [{"name": "kvCacheUsage", "target": 0.5, "value": 0.9}]
        assert status["lastScaleTime"].endswith("Z")
        events = await eventually(lambda: events_with_reason(emulator, "ScaledUp"))
        assert "kvCacheUsage 0.9 above target 0.5" in events[0]["message"]
        assert events[0]["involvedObject"]["name"] == "svc"
        # the reconciler carries spec.replicas to the Deployment
        await eventually(lambda: emulator.read(DEPLOYMENTS, NS, "svc")["spec"]["replicas"] == 2)

        for engine in engines[:2]:
            engine.kv_usage = 0.05
        await add_ready_pod(emulator, NS, pod_manifest("svc-1", "svc", engines[1].ip))

        await eventually(lambda: replicas_of(emulator) == 1)
        # spec.replicas and status.autoscaling are two writes: wait for the second
        status = await eventually(
            lambda: (autoscaling_status(emulator) or {}).get("desiredReplicas") == 1 and autoscaling_status(emulator)
        )
        assert status["lastScaleReason"].startswith("kvCacheUsage 0.05 below target 0.5: 2 -> 1 replicas")


@pytest.mark.timeout(120)
async def test_garbage_and_silent_pods_never_cause_a_scale_down(emulator):
    async with fake_engines(3) as engines, running_operator():
        await emulator.create(ISVC, inference_service("svc", replicas=3))
        engines[0].kv_usage = 0.05
        engines[1].mode = "garbage"
        engines[2].mode = "silent"
        for i, engine in enumerate(engines):
            await add_ready_pod(emulator, NS, pod_manifest(f"svc-{i}", "svc", engine.ip))

        await eventually(lambda: autoscaling_status(emulator))
        # Rounds past the scale-down window (2 s) after the first decision, counted by the good pod's scrapes:
        # each round lasts at least the interval (0.5 s) plus the silent pod's scrape timeout (0.5 s), so the
        # third round scraping after this point decides >= 2 s after the first decision, and the fourth
        # round's scrape proves that third one finished (any scale patch made).
        scraped = engines[0].scrapes
        await eventually(lambda: engines[0].scrapes >= scraped + 4)
        assert replicas_of(emulator) == 3
        assert not events_with_reason(emulator, "ScaledDown")

        engines[1].mode = engines[2].mode = "ok"
        engines[1].kv_usage = engines[2].kv_usage = 0.05
        await eventually(lambda: replicas_of(emulator) == 1)


@pytest.mark.timeout(120)
async def test_disabled_autoscaling_leaves_replicas_to_the_user(emulator):
    async with fake_engines(2) as engines, running_operator():
        await emulator.create(ISVC, inference_service("svc", replicas=1, enabled=False))
        engines[0].kv_usage = 1.0
        await add_ready_pod(emulator, NS, pod_manifest("svc-0", "svc", engines[0].ip))
        # A control created after it, autoscaled and at target: once its loop has run rounds with its pod
        # ready, a loop started for "svc" (earlier, at the same interval) would have scraped and scaled too.
        await emulator.create(ISVC, inference_service("control", replicas=1))
        engines[1].kv_usage = 0.5
        await add_ready_pod(emulator, NS, pod_manifest("control-0", "control", engines[1].ip))
        await eventually(lambda: engines[1].scrapes >= 3)
        assert autoscaling_status(emulator, "control")["desiredReplicas"] == 1
        assert engines[0].scrapes == 0
        assert replicas_of(emulator) == 1
        assert autoscaling_status(emulator) is None

        await emulator.merge(ISVC, NS, "svc", {"spec": {"autoscaling": {"enabled": True}}})
        await eventually(lambda: replicas_of(emulator) == 2)


@pytest.mark.timeout(60)
async def test_an_invalid_autoscaling_spec_is_reported_not_acted_on(emulator):
    """The reconciler runs the autoscaler's own parse: Valid=False names every problem, nothing is deployed."""
    async with fake_engines(1) as engines, running_operator():
        body = inference_service("svc", replicas=1, intervalSeconds=-1)
        del body["spec"]["maxReplicas"]
        await emulator.create(ISVC, body)
        engines[0].kv_usage = 1.0
        await add_ready_pod(emulator, NS, pod_manifest("svc-0", "svc", engines[0].ip))
        events = await eventually(lambda: events_with_reason(emulator, "InvalidAutoscaling"))
        assert "spec.maxReplicas is required" in events[0]["message"]
        valid = await eventually(lambda: condition(emulator.read(ISVC, NS, "svc"), "Valid"))
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        assert "spec.maxReplicas is required" in valid["message"]
        assert "spec.autoscaling.intervalSeconds must be positive, got -1" in valid["message"]
        # The reconciler posts its Warning Event after writing the condition: it can be seen later.
        await eventually(
            lambda: any("spec.maxReplicas" in e["message"] for e in events_with_reason(emulator, "InvalidSpec"))
        )
        assert replicas_of(emulator) == 1 and emulator.read(DEPLOYMENTS, NS, "svc") is None


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
    assert status == {
        "currentMetrics": [{"name": "kvCacheUsage", "target": 0.5, "value": 0.5}],
        "desiredReplicas": 2,
        **previous,
    }
    up = decide(spec, Observation(1, 1, 0, {"kvCacheUsage": MetricSample(1.0, 1)}), AutoscalerState(), 0.0)
    assert build_status(up, previous, "2024-01-02T00:00:00Z")["lastScaleTime"] == "2024-01-02T00:00:00Z"
