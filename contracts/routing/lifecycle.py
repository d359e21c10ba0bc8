"""Timing that the router and the operator must agree on, in one place (no imports: the operator reads it).

An engine pod that is being deleted must leave every router's candidate set
before it receives SIGTERM. The EndpointSlice controller marks its endpoint
`terminating` (ready=false) as soon as the pod has a deletionTimestamp; the
router sees that at its next EndpointSlice poll, at most
`DISCOVERY_POLL_INTERVAL_SECONDS` later, plus the list's own round trip. The
engine's preStop hook waits that long plus `DRAIN_MARGIN_SECONDS` (the
controller's write and the router's list) before the kubelet sends SIGTERM,
so no new request reaches an engine that is about to drain
(`engine_pre_stop_seconds`).

A new engine pod must not count as ready before the router has warmed it.
With warm-up on, the operator gives the engine pods the readiness gate
`WARMED_CONDITION`; the router finds such a pod among the not-ready
endpoints, replays its hot prefixes to it, and sets the pod's condition
True (PATCH pods/status), so the kubelet marks it Ready only then and a
rollout waits for it. The router sets it at the latest
`WARMUP_GATE_TIMEOUT_SECONDS` after it found the engine healthy, warmed or
not, so a slow or failing warm-up never holds a rollout longer. With no
router pod ready to do it, the operator sets it itself on a pod whose
containers have been ready that long with the gate still closed (reason
`NoRouter`, operator/routing/gate_fallback.py), so a rollout never waits on
a router that is down. Both write `warmed_condition`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from pagedinfer.contracts import validators

DISCOVERY_POLL_INTERVAL_SECONDS = 1.0  # `pagedinfer router --discovery-poll-interval-seconds` default
DRAIN_MARGIN_SECONDS = 2.0  # the EndpointSlice controller's write + one list by the router


def engine_pre_stop_seconds(poll_interval_seconds: float = DISCOVERY_POLL_INTERVAL_SECONDS) -> int:
    """Whole seconds an engine's preStop waits so every router has dropped it before SIGTERM."""
    validators.positive_seconds("poll_interval_seconds", poll_interval_seconds)
    return math.ceil(poll_interval_seconds + DRAIN_MARGIN_SECONDS)


WARMED_CONDITION = "pagedinfer.io/warmed"  # the engine pods' readiness gate (conditionType)
WARMUP_GATE_TIMEOUT_SECONDS = 60.0  # the router sets the condition this long after the engine is healthy at most


def warmed_condition(reason: str, message: str, now: datetime) -> dict[str, str]:
    """The pod condition that opens the gate: a strategic merge patch's `status.conditions` item (merged by type)."""
    return {
        "type": WARMED_CONDITION,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
