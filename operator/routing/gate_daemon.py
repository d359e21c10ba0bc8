"""The kopf daemon that opens engine pods' warm-up readiness gates while no router pod is ready.

One loop per InferenceService whose `spec.router` is on with warm-up on (the
services whose engine pods carry the `pagedinfer.io/warmed` gate;
engine_flags.engine_readiness_gates); kopf stops it when either turns off.
Every `TICK_SECONDS` it reads the live body's status (gate_fallback.py says
what and why) and:

1. no engine pod reported not Ready: nothing (no API call);
2. else, when those counts changed since its last list or
   `OperatorConfig.warmup_gate_poll_seconds` have passed since then, lists
   the service's engine pods (`pods` list, as the autoscaler)
   and keeps those whose gate has been closed for
   `OperatorConfig.warmup_gate_timeout_seconds` (the router's own bound,
   60 s) with their containers ready;
3. if there are any, reads the router Deployment (`NAME-router`): with a
   pod available, leaves them to the router (logged once per pod: "left to
   the router"); when it cannot be read, decides nothing this round;
4. with none available (or no router Deployment), opens each one's gate (`PATCH pods/NAME/status`, a strategic
   merge patch of the `pagedinfer.io/warmed` condition, reason `NoRouter`:
   the chart grants `patch` on `pods/status`, which the routers' Role needs
   too), logs it and posts a Warning Event `NoRouter` on the
   InferenceService. A pod gone meanwhile (404) needs nothing; any other
   failure is logged and tried again at the next round.

The loop never raises: an API error ends the round, not the daemon.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, PLURAL
from pagedinfer.contracts.routing.lifecycle import WARMED_CONDITION
from pagedinfer.operator.children.labels import selector_string
from pagedinfer.operator.kube_api import DEPLOYMENTS, PODS, STRATEGIC_MERGE_PATCH, KubeApi, KubeApiError
from pagedinfer.operator.registry import REGISTRY
from pagedinfer.operator.routing.builders import router_name
from pagedinfer.operator.routing.engine_flags import engine_readiness_gates
from pagedinfer.operator.routing.gate_fallback import (
    NO_ROUTER,
    available_routers,
    closed_gates,
    engines_waiting,
    open_patch,
    overdue,
)
from pagedinfer.operator.routing.spec import parse_router_spec
from pagedinfer.operator.settings import OperatorConfig, runtime_of
from pagedinfer.operator.stopping import sleep_unless_stopped

TICK_SECONDS = 0.5  # how often the (free) status check runs


@dataclasses.dataclass
class GateMemory:
    """What one InferenceService's loop carries between rounds: the pods already said to be left to the router."""

    left_to_router: set[str] = dataclasses.field(default_factory=set)  # pod uids
    listed_for: tuple[Any, Any] | None = None  # the engine status (replicas, readyReplicas) of the last list
    next_list_at: float = 0.0  # time.monotonic() after which the pods are listed again anyway


def _warmup_gated(spec: Mapping[str, Any], **_: Any) -> bool:
    """Whether the engine pods carry the warm-up gate (engine_readiness_gates, on the spec as the reconciler parses it)."""
    try:
        router = parse_router_spec(spec.get("router"), spec.get("maxReplicas"))
    except (ValueError, TypeError):
        return False
    return bool(engine_readiness_gates(router))


@kopf.daemon(API_GROUP, API_VERSION, PLURAL, registry=REGISTRY, when=_warmup_gated, cancellation_timeout=10.0)
async def open_gates_without_router(
    stopped: kopf.DaemonStopped, body: kopf.Body, name: str, namespace: str, memo: Any, logger: logging.Logger, **_: Any
) -> None:
    runtime = runtime_of(memo)
    memory = GateMemory()
    while not stopped:
        await gate_round(runtime.kube, runtime.config, body, name, namespace, memory, logger)
        await sleep_unless_stopped(stopped, min(TICK_SECONDS, runtime.config.warmup_gate_poll_seconds))


async def gate_round(
    kube: KubeApi,
    config: OperatorConfig,
    body: kopf.Body,
    name: str,
    namespace: str,
    memory: GateMemory,
    logger: logging.Logger,
) -> None:
    """One round (the module's steps 1-4)."""
    status = body.get("status") or {}
    if not engines_waiting(status):
        memory.listed_for = None
        return
    counts, monotonic_now = (status.get("replicas"), status.get("readyReplicas")), time.monotonic()
    if counts == memory.listed_for and monotonic_now < memory.next_list_at:
        return
    memory.listed_for, memory.next_list_at = counts, monotonic_now + config.warmup_gate_poll_seconds
    try:
        pods = await kube.list(PODS, namespace, label_selector=selector_string(name))
    except KubeApiError as e:
        logger.warning("warm-up gates: cannot list the engine pods: %s", e)
        return
    now = datetime.now(UTC)
    late = overdue(closed_gates(pods, now), config.warmup_gate_timeout_seconds)
    memory.left_to_router &= {g.uid for g in late}
    if not late:
        return
    try:
        routers = available_routers(await kube.get(DEPLOYMENTS, namespace, router_name(name)))
    except KubeApiError as e:
        logger.warning("warm-up gates: cannot read the router Deployment: %s", e)
        return
    for gate in late:
        if routers:
            if gate.uid not in memory.left_to_router:
                memory.left_to_router.add(gate.uid)
                logger.info(
                    f"pod {gate.pod}: {WARMED_CONDITION} still closed {gate.closed_seconds:.0f} s after its containers"
                    f" were ready; {routers} router pod(s) available: left to the router"
                )
            continue
        try:
            await kube.patch(PODS, namespace, gate.pod, open_patch(gate, now), "status", STRATEGIC_MERGE_PATCH)
        except KubeApiError as e:
            if e.status != 404:
                logger.warning(f"warm-up gates: cannot set {WARMED_CONDITION} on pod {gate.pod}: {e}; trying again")
            continue
        message = (
            f"no router pod is available: opened pod {gate.pod}'s readiness gate {WARMED_CONDITION} without warm-up,"
            f" {gate.closed_seconds:.0f} s after its containers were ready"
        )
        logger.info(message)
        kopf.event(body, type="Warning", reason=NO_ROUTER, message=message)
