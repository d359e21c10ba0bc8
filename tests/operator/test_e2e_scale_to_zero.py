"""Scale to zero under the real kopf runtime against the emulated API server: an idle InferenceService with
`minReplicas: 0` goes to zero replicas after its idle window, saying why in status and an Event; the router's
demand annotation, written over HTTP as the router writes it, brings one replica back at once; and each spec
that could not work is Valid=False naming its field.

The engine and router pods are HTTP servers on loopback addresses serving the /metrics we set
(tests/support/fake_engine_metrics.py): the router's queue stays at 0 throughout, so the daemon's own
fallback (0 -> 1 on a queued request) never fires and the scale from zero is the demand handler's.
"""

from __future__ import annotations

import pytest
from fake_engine_metrics import fake_engines

from pagedinfer.contracts.routing.demand import DEMAND_ANNOTATION
from pagedinfer.operator.routing.builders import router_selector_labels
from pagedinfer.router.hold.demand import DemandSignal, DemandTarget
from pagedinfer.testing.kubelet_harness import PODS, add_ready_pod, pod_manifest
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    EVENTS,
    ISVC,
    condition,
    eventually,
    inference_service,
    kubeconfig_server,
    running_operator,
)

NS = "default"
pytestmark = pytest.mark.timeout(90)


def scale_to_zero_spec(**overrides):
    return {
        "resources": {"gpus": 0},
        "replicas": 1,
        "minReplicas": 0,
        "maxReplicas": 2,
        "router": {"replicas": 1},
        "autoscaling": {
            "enabled": True,
            "intervalSeconds": 0.3,
            "scrapeTimeoutSeconds": 0.5,
            "metrics": [{"name": "kvCacheUsage", "target": 0.5}],
            "idle": {"afterSeconds": 1},
        },
        **overrides,
    }


def events(emulator, reason):
    return [e for e in emulator.read_all(EVENTS, NS) if e.get("reason") == reason]


def status_of(emulator, name="svc"):
    return (emulator.read(ISVC, NS, name).get("status") or {}).get("autoscaling") or {}


async def test_idle_goes_to_zero_then_the_routers_demand_brings_one_replica_back(emulator):
    async with fake_engines(2) as (engine, router), running_operator():
        router.router_queue_length = 0
        await emulator.create(ISVC, inference_service("svc", scale_to_zero_spec()))
        await add_ready_pod(emulator, NS, pod_manifest("svc-engine-0", "svc", engine.ip))
        router_pod = pod_manifest("svc-router-0", "svc", router.ip)
        router_pod["metadata"]["labels"] = router_selector_labels("svc")
        await add_ready_pod(emulator, NS, router_pod)

        await eventually(lambda: emulator.read(DEPLOYMENTS, NS, "svc")["spec"]["replicas"] == 0, timeout_seconds=30)
        reason = status_of(emulator)["lastScaleReason"]
        assert reason.startswith("idle for ") and reason.endswith(
            "(afterSeconds 1): no request running or waiting at the engines, none queued at the router: 1 -> 0 replicas"
        )
        (event,) = await eventually(lambda: events(emulator, "ScaledToZero"))
        assert event["message"] == reason and event["type"] == "Normal"
        await eventually(lambda: condition(emulator.read(ISVC, NS, "svc"), "Available")["reason"] == "ScaledToZero")
        assert engine.scrapes and router.scrapes  # both were read: the decision saw zero requests at each
        await emulator.remove(PODS, NS, "svc-engine-0")  # the ReplicaSet's part
        idle = await eventually(lambda: status_of(emulator).get("idleSince") and status_of(emulator))
        assert idle["routerQueueLength"] == 0 and idle["requestsInFlight"] == 0 and idle["desiredReplicas"] == 0

        # The router's own demand signal: a JSON merge patch of the annotation alone, over HTTP.
        signal = DemandSignal(DemandTarget("svc", NS, kubeconfig_server()))
        try:
            assert await signal.signal(), signal.problem
        finally:
            await signal.aclose()
        demand_at = emulator.read(ISVC, NS, "svc")["metadata"]["annotations"][DEMAND_ANNOTATION]

        await eventually(lambda: emulator.read(DEPLOYMENTS, NS, "svc")["spec"]["replicas"] == 1, timeout_seconds=30)
        (event,) = await eventually(lambda: events(emulator, "ScaledFromZero"))
        assert (
            event["message"] == f"the router holds requests and has no engine (demand at {demand_at}): 0 -> 1 replica"
        )
        assert router.router_queue_length == 0  # the daemon saw nothing queued: the demand handler scaled
        await eventually(lambda: status_of(emulator).get("lastScaleReason") == event["message"])


@pytest.mark.parametrize(
    "name, spec, field",
    [
        ("no-router", scale_to_zero_spec(router={"enabled": False}), "spec.minReplicas: 0 needs the router"),
        (
            "idle-zero",
            scale_to_zero_spec(
                autoscaling={
                    "enabled": True,
                    "idle": {"afterSeconds": 0},
                    "metrics": [{"name": "kvCacheUsage", "target": 0.5}],
                }
            ),
            "spec.autoscaling.idle.afterSeconds",
        ),
        ("queue-zero", scale_to_zero_spec(router={"queue": {"maxRequests": 0}}), "spec.router.queue.maxRequests"),
    ],
)
async def test_a_scale_to_zero_spec_that_cannot_work_is_invalid_naming_the_field(emulator, name, spec, field):
    async with running_operator():
        await emulator.create(ISVC, inference_service(name, spec))
        valid = await eventually(
            lambda: (
                condition(emulator.read(ISVC, NS, name), "Valid")["status"] == "False"
                and condition(emulator.read(ISVC, NS, name), "Valid")
            )
        )
        assert valid["reason"] == "InvalidSpec" and field in valid["message"]
        assert emulator.read(DEPLOYMENTS, NS, name) is None


async def test_idle_with_standby_keeps_k_replicas_and_puts_every_awake_engine_to_sleep(emulator):
    async with fake_engines(3) as (first, second, router), running_operator():
        router.router_queue_length = 0
        second.sleep_status = 503  # refused once: asked again in a later round
        spec = scale_to_zero_spec(replicas=2)
        spec["autoscaling"]["standby"] = 1
        await emulator.create(ISVC, inference_service("svc", spec))
        for i, engine in enumerate((first, second)):
            await add_ready_pod(emulator, NS, pod_manifest(f"svc-engine-{i}", "svc", engine.ip))
        router_pod = pod_manifest("svc-router-0", "svc", router.ip)
        router_pod["metadata"]["labels"] = router_selector_labels("svc")
        await add_ready_pod(emulator, NS, router_pod)

        await eventually(
            lambda: first.sleeping and emulator.read(ISVC, NS, "svc")["spec"]["replicas"] == 1, timeout_seconds=30
        )
        (event, *_) = await eventually(lambda: events(emulator, "Standby"))
        assert event["message"].endswith(": 2 -> 1 replicas, 2 awake engines put to sleep (standby 1)")
        second.sleep_status = 200
        await eventually(lambda: second.sleeping, timeout_seconds=30)
        status = await eventually(lambda: status_of(emulator).get("asleepReplicas") == 2 and status_of(emulator))
        assert status["lastScaleReason"].endswith(": 1 awake engines put to sleep (standby 1)")
