"""The warm-up readiness gate's fallback through the real kopf runtime against the emulator: with no router
pod ready the operator opens a new engine pod's `pagedinfer.io/warmed` gate itself once its containers have
been ready for the timeout (reason NoRouter), so a rollout never waits on a router that is down; with a
router pod ready it leaves the gate to the router (operator/routing/gate_daemon.py).

The emulator has no controllers: the tests play the kubelet (a pod made from the engine Deployment's pod
template, containers ready; the emulator holds it not Ready while a gate is closed, as the kubelet does) and
the Deployment controller (`roll_out`), and say so. The timeout is the operator's setting, 1 s here.
"""

import dataclasses
import logging
from datetime import datetime

import pytest

from pagedinfer.contracts.routing.lifecycle import WARMED_CONDITION
from pagedinfer.testing.kubelet_harness import PODS, add_ready_pod, pod_from_template, pod_is_ready
from pagedinfer.testing.operator_harness import (
    EVENTS,
    FAST_CONFIG,
    ISVC,
    LLAMA3_8B_SPEC,
    add_gpu_node,
    condition,
    deployment_of,
    eventually,
    inference_service,
    logged,
    roll_out,
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

CONFIG = dataclasses.replace(FAST_CONFIG, warmup_gate_timeout_seconds=1.0, warmup_gate_poll_seconds=0.1)
ROUTED = {**LLAMA3_8B_SPEC, "maxReplicas": 2}  # the router on by default, and its warm-up


def pod(emulator, name):
    return emulator.read(PODS, "default", name)


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def new_engine_pod(emulator, service: str) -> str:
    """Play the ReplicaSet and the kubelet: a pod of the engine Deployment's template whose containers just
    turned ready; and the Deployment controller: one pod, none Ready (the gate holds it)."""
    deployment = await eventually(lambda: deployment_of(emulator, service))
    template = deployment["spec"]["template"]
    assert template["spec"]["readinessGates"] == [{"conditionType": WARMED_CONDITION}]
    name = f"{service}-engine-1"
    await add_ready_pod(emulator, "default", pod_from_template(name, template, "127.0.0.250"))
    assert not pod_is_ready(pod(emulator, name))
    await roll_out(emulator, service, ready=0, replicas=1)
    return name


async def gate_opened_by_the_operator(emulator, service: str, name: str) -> None:
    ready = await eventually(lambda: pod_is_ready(pod(emulator, name)) and pod(emulator, name), timeout_seconds=30)
    gate, containers = condition(ready, WARMED_CONDITION), condition(ready, "ContainersReady")
    assert (gate["status"], gate["reason"]) == ("True", "NoRouter")
    # not before the timeout (whole-second stamps, both rounded down: the gap is at least the 1 s)
    assert seconds(gate["lastTransitionTime"]) - seconds(containers["lastTransitionTime"]) >= 1.0
    # and says so in a Warning Event on the InferenceService (kopf posts it in the background)
    await eventually(
        lambda: [
            e
            for e in emulator.read_all(EVENTS, "default")
            if (e.get("type"), e.get("reason")) == ("Warning", "NoRouter")
            and e["involvedObject"]["name"] == service
            and name in e["message"]
        ]
    )


async def test_with_no_router_ready_the_operator_opens_the_gate_after_the_timeout(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator(CONFIG):
        await emulator.create(ISVC, inference_service("cold", ROUTED))
        name = await new_engine_pod(emulator, "cold")  # the router Deployment never reports a ready pod
        await gate_opened_by_the_operator(emulator, "cold", name)


async def test_with_a_router_ready_the_gate_is_left_to_it_until_the_router_goes_down(emulator, caplog):
    caplog.set_level(logging.INFO, logger="kopf.objects")
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator(CONFIG):
        await emulator.create(ISVC, inference_service("warm", ROUTED))
        await eventually(lambda: deployment_of(emulator, "warm-router"))
        await roll_out(emulator, "warm-router", ready=1)  # the Deployment controller: one router pod available
        name = await new_engine_pod(emulator, "warm")
        # the operator's loop has seen the gate closed past the timeout, and left it to the router
        await eventually(lambda: logged(caplog.records, "warm", f"pod {name}: {WARMED_CONDITION} still closed"))
        assert "left to the router" in caplog.text
        with pytest.raises(KeyError):
            condition(pod(emulator, name), WARMED_CONDITION)
        assert not pod_is_ready(pod(emulator, name))
        # the router's pods go down (crash-looping, say): the operator opens the gate
        await roll_out(emulator, "warm-router", ready=0)
        await gate_opened_by_the_operator(emulator, "warm", name)
