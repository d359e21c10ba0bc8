"""The operator's fallback for the engine pods' warm-up readiness gate (pure: which pods, and the patch).

With warm-up on, an engine pod carries `readinessGates: [{conditionType:
pagedinfer.io/warmed}]` and is Ready only once that condition is True; the
router sets it (contracts/routing/lifecycle.py). While no router pod is ready
(all down, crash-looping, the router Deployment unavailable) nobody would,
and a rollout or a scale-up would wait forever. So the operator sets it
itself (reason `NoRouter`, gate_daemon.py) on each engine pod that

- carries the gate and is not being deleted,
- has its containers ready (ContainersReady True), with the condition not True,
- and has had them ready for the timeout (`WARMUP_GATE_TIMEOUT_SECONDS`, the
  router's own bound) or longer, counted from ContainersReady's
  lastTransitionTime, else (a status without one) from the pod's
  creationTimestamp: API-server time, so an operator restart does not
  restart the count.

While a router pod is ready the operator sets nothing: the router opens the
gate, warm or not, within the same bound.

When to look, at no API cost: the InferenceService's `status.replicas` /
`status.readyReplicas` (the engine Deployment's pods, and those of them
Ready), which the operator keeps from the Deployment's watch events
(child_events). A closed gate keeps its pod out of readyReplicas, so while
readyReplicas >= replicas no pod can be waiting and no pod is listed.
Whether a router is up is read from the router Deployment itself
(`status.availableReplicas`), and only once a gate is overdue: the owner's
`status.routing` can lag it (a reconcile writes what it last saw).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pagedinfer.contracts.routing.lifecycle import WARMED_CONDITION, warmed_condition

NO_ROUTER = "NoRouter"  # the condition's reason when the operator opened the gate


@dataclass(frozen=True)
class ClosedGate:
    """An engine pod whose containers are ready while its warm-up gate is still closed."""

    pod: str
    uid: str
    closed_seconds: float  # since its containers turned ready (>= 0)


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return None


def _timestamp(value: Any) -> datetime | None:
    """An RFC 3339 time of the API (`2026-12-04T20:21:46Z`), None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def closed_gates(pods: Iterable[Mapping[str, Any]], now: datetime) -> list[ClosedGate]:
    """The pods (an InferenceService's engine pods) that wait only on their warm-up gate, in the given order."""
    waiting = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        gates = [g.get("conditionType") for g in (pod.get("spec") or {}).get("readinessGates") or []]
        if WARMED_CONDITION not in gates or meta.get("deletionTimestamp"):
            continue
        containers = _condition(pod, "ContainersReady")
        gate = _condition(pod, WARMED_CONDITION)
        if containers is None or containers.get("status") != "True" or (gate or {}).get("status") == "True":
            continue
        since = _timestamp(containers.get("lastTransitionTime")) or _timestamp(meta.get("creationTimestamp"))
        closed = max(0.0, (now - since).total_seconds()) if since is not None else 0.0
        waiting.append(ClosedGate(meta.get("name", ""), meta.get("uid") or meta.get("name", ""), closed))
    return waiting


def overdue(gates: Iterable[ClosedGate], timeout_seconds: float) -> list[ClosedGate]:
    """The gates closed for `timeout_seconds` or longer."""
    return [g for g in gates if g.closed_seconds >= timeout_seconds]


def available_routers(deployment: Mapping[str, Any] | None) -> int:
    """The router Deployment's available pods (0 when it is absent or its controller reported none)."""
    value = ((deployment or {}).get("status") or {}).get("availableReplicas")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def engines_waiting(status: Mapping[str, Any] | None) -> bool:
    """Whether the engine Deployment reports a pod that is not Ready (readyReplicas < replicas)."""
    status = status or {}
    replicas, ready = status.get("replicas"), status.get("readyReplicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        return False
    return replicas > (ready if isinstance(ready, int) and not isinstance(ready, bool) else 0)


def open_patch(gate: ClosedGate, now: datetime) -> dict[str, Any]:
    """The strategic merge patch of pods/NAME/status that opens `gate` (merged by type: other conditions stay)."""
    message = (
        f"no router pod was ready to warm the pod; opened by the operator {gate.closed_seconds:.0f} s"
        " after its containers were ready, without warm-up"
    )
    return {"status": {"conditions": [warmed_condition(NO_ROUTER, message, now)]}}
