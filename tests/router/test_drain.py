"""Drain before termination, the pure parts: the EndpointSlice a deleting pod gets (as Kubernetes' controller
writes it), the router dropping it, and the engine's preStop wait sized from the router's poll interval."""

import pytest

from pagedinfer.contracts.routing.lifecycle import (
    DISCOVERY_POLL_INTERVAL_SECONDS,
    DRAIN_MARGIN_SECONDS,
    engine_pre_stop_seconds,
)
from pagedinfer.operator.children import builders
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.parser import parse_spec
from pagedinfer.router.discovery import ready_engine_urls
from pagedinfer.testing.endpoint_slices import endpoint_slice

PLAN = planning.KVCachePlan(source="engine", block_size=16, num_gpu_blocks=None)
SERVICE = {
    "metadata": {"name": "svc-engines", "namespace": "ns"},
    "spec": {"selector": {"app": "engine"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
}


def pod(name, ip, ready=True, deleting=False):
    meta = {"name": name, "labels": {"app": "engine"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8001}]}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_deleting_pod_is_terminating_and_serving_and_the_router_drops_it():
    pods = [
        pod("a", "10.0.0.1"),
        pod("b", "10.0.0.2", deleting=True),
        pod("c", "10.0.0.3", ready=False),
        {**pod("d", "10.0.0.4"), "metadata": {"name": "d", "labels": {"app": "other"}}},
    ]
    s = endpoint_slice(SERVICE, pods)
    assert s["ports"] == [{"name": "http", "port": 8001, "protocol": "TCP"}]
    assert [e["conditions"] for e in s["endpoints"]] == [
        {"ready": True, "serving": True, "terminating": False},
        {"ready": False, "serving": True, "terminating": True},  # in its preStop: still serving, not ready
        {"ready": False, "serving": False, "terminating": False},
    ]
    assert ready_engine_urls([s]) == ["http://10.0.0.1:8001"]


def test_the_engines_pre_stop_outlasts_the_routers_poll_and_the_grace_period_covers_the_drain():
    assert engine_pre_stop_seconds() >= DISCOVERY_POLL_INTERVAL_SECONDS + DRAIN_MARGIN_SECONDS
    assert engine_pre_stop_seconds(4.5) == 7
    with pytest.raises(ValueError, match="poll_interval_seconds"):
        engine_pre_stop_seconds(0)
    for router, wait in (
        ({"enabled": True}, engine_pre_stop_seconds()),
        ({"enabled": False}, builders.PRE_STOP_SLEEP_SECONDS),
    ):
        spec = parse_spec("m", {"model": {"uri": "pvc://models/m"}, "router": router})
        pod_spec = builders.build_pod_spec(spec, PLAN)
        assert pod_spec["containers"][0]["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", str(wait)]}}
        assert pod_spec["terminationGracePeriodSeconds"] == wait + builders.ENGINE_DRAIN_SECONDS + 20
