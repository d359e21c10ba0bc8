"""Which engine pods the operator's warm-up gate fallback opens, and when it looks (operator/routing/gate_fallback.py)."""

from datetime import UTC, datetime

from pagedinfer.contracts.routing.lifecycle import WARMED_CONDITION
from pagedinfer.operator.routing.gate_fallback import (
    NO_ROUTER,
    ClosedGate,
    available_routers,
    closed_gates,
    engines_waiting,
    open_patch,
    overdue,
)

NOW = datetime(2026, 12, 4, 20, 0, 0, tzinfo=UTC)
GATES = [{"conditionType": WARMED_CONDITION}]


def pod(name, *conditions, gates=GATES, created="2026-12-04T19:00:00Z", **meta):
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created, **meta},
        "spec": {"readinessGates": gates},
        "status": {
            "conditions": [dict(zip(("type", "status", "lastTransitionTime"), c, strict=False)) for c in conditions]
        },
    }


def test_only_pods_waiting_on_the_gate_alone_count_and_from_when_their_containers_were_ready():
    pods = [
        pod("waiting", ("ContainersReady", "True", "2026-12-04T19:59:00Z"), ("Ready", "False")),
        pod("no-stamp", ("ContainersReady", "True")),  # counted from its creation
        pod("starting", ("ContainersReady", "False", "2026-12-04T19:00:00Z")),
        pod("no-containers-yet"),
        pod("opened", ("ContainersReady", "True", "2026-12-04T19:00:00Z"), (WARMED_CONDITION, "True")),
        pod("closed-false", ("ContainersReady", "True", "2026-12-04T19:59:30Z"), (WARMED_CONDITION, "False")),
        pod("ungated", ("ContainersReady", "True", "2026-12-04T19:00:00Z"), gates=[]),
        pod("leaving", ("ContainersReady", "True", "2026-12-04T19:00:00Z"), deletionTimestamp="2026-12-04T19:59:59Z"),
        pod("clock-ahead", ("ContainersReady", "True", "2026-12-04T20:00:05Z")),
    ]
    assert closed_gates(pods, NOW) == [
        ClosedGate("waiting", "uid-waiting", 60.0),
        ClosedGate("no-stamp", "uid-no-stamp", 3600.0),
        ClosedGate("closed-false", "uid-closed-false", 30.0),
        ClosedGate("clock-ahead", "uid-clock-ahead", 0.0),
    ]
    assert [g.pod for g in overdue(closed_gates(pods, NOW), 60.0)] == ["waiting", "no-stamp"]


def test_the_status_says_when_to_look_and_the_router_deployment_whether_a_router_is_up():
    assert engines_waiting({"replicas": 2, "readyReplicas": 1})
    assert engines_waiting({"replicas": 1})
    assert not engines_waiting({"replicas": 2, "readyReplicas": 2})
    assert not engines_waiting({})
    assert not engines_waiting(None)
    assert available_routers({"status": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 1}}) == 1
    assert available_routers({"status": {}}) == 0
    assert available_routers(None) == 0


def test_the_patch_sets_only_the_gates_condition_with_the_reason_no_router():
    (condition,) = open_patch(ClosedGate("p", "u", 61.2), NOW)["status"]["conditions"]
    assert condition["type"] == WARMED_CONDITION and condition["status"] == "True"
    assert condition["reason"] == NO_ROUTER and "61 s" in condition["message"]
    assert condition["lastTransitionTime"] == "2026-12-04T20:00:00Z"
