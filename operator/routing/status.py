"""`status.routing` of an InferenceService (pure): whether a router fronts the engines.

    routing: {enabled: true, policy: prefix, replicas: 2, readyReplicas: 2}
    routing: {enabled: false, policy: "off", replicas: 0, readyReplicas: 0}

`policy` is what the `Routing` printer column shows ("off" without a router).
readyReplicas comes from the router Deployment's status: the reconcile writes
what it last saw, and every event of that Deployment updates it
(child_events), as replicas/readyReplicas follow the engines' Deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedinfer.operator.routing.spec import RouterSpec

OFF = "off"


def routing_status(router: RouterSpec, deployment: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.routing for `router`; `deployment`: the router Deployment as last seen (None: not known)."""
    if not router.enabled:
        return {"enabled": False, "policy": OFF, "replicas": 0, "readyReplicas": 0}
    return {"enabled": True, "policy": router.policy, "replicas": router.replicas, **router_ready(deployment)}


def router_ready(deployment: Mapping[str, Any] | None) -> dict[str, int]:
    """{readyReplicas} of a router Deployment (0 before its controller reports any)."""
    if deployment is None or deployment.get("kind") != "Deployment":
        return {"readyReplicas": 0}
    return {"readyReplicas": int((deployment.get("status") or {}).get("readyReplicas") or 0)}
