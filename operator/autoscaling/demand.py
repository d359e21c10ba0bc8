"""The demand path: the router asks for an engine, and the operator scales 0 -> 1 at once.

While requests wait in its hold queue and it has no engine to send them to
or wake, the router writes `pagedinfer.io/demand-at: <RFC 3339 time>` on its
own InferenceService (router/hold/demand.py; the name is a contract,
`contracts.routing.demand.DEMAND_ANNOTATION`), at most once per few seconds. A
kopf field handler sees the annotation change in the watch stream and, if
the service is scaled to zero by the idle rule, sets `spec.replicas` to 1
through the scale subresource, posts an Event `ScaledFromZero` and writes
status.autoscaling's lastScaleReason, without waiting for an autoscaler
round or a metrics scrape.

Why the router writes through the API rather than pushing to the operator:
the API server is already the one channel both trust and reach (the router
polls its EndpointSlices there; the operator watches there), it survives an
operator restart or a second operator replica (the annotation stays until
handled; a push to one replica can be lost), it needs no listening port, no
Service and no authentication of its own on the operator, and the router's
extra right is one verb pair on one object: `get`, `patch` on its own
InferenceService by `resourceNames` (routing.builders). It cannot change
the spec through it in any way the operator would not repair or refuse: the
operator only reads the annotation as "a request is waiting".

What the handler does with a demand (`answer_demand`, pure):
- scale to zero off (no `minReplicas: 0`, or autoscaling disabled): nothing
  (an Event says the demand was ignored and why);
- replicas > 0: nothing. An engine is starting, or standby engines are
  asleep and the router wakes one itself (POST /wake_up: much faster than
  a new pod); the operator never races the router's wake;
- replicas 0: 0 -> 1. The metric rules take over from there.
The idle rule's timer is reset, so the new replica gets a whole idle window.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, PLURAL
from pagedinfer.contracts.routing.demand import DEMAND_ANNOTATION
from pagedinfer.operator.autoscaling.daemon import memory_of
from pagedinfer.operator.autoscaling.idle import SCALED_FROM_ZERO, IdleState
from pagedinfer.operator.autoscaling.spec import parse_autoscaling_spec
from pagedinfer.operator.kube_api import INFERENCESERVICES, KubeApiError
from pagedinfer.operator.registry import REGISTRY
from pagedinfer.operator.settings import runtime_of
from pagedinfer.operator.status.conditions import now_rfc3339

DEMAND_IGNORED = "DemandIgnored"


@dataclass(frozen=True)
class DemandAnswer:
    """What to do with one demand: `replicas` to scale to (None: nothing), why, in words, and the Event's
    reason ("" for none: a demand while a replica starts is routine)."""

    replicas: int | None
    reason: str
    event: str = ""


def answer_demand(spec: Mapping[str, Any], demand_at: str) -> DemandAnswer:
    """The answer to a demand written at `demand_at`, given the InferenceService's raw `spec`."""
    try:
        autoscaling = parse_autoscaling_spec(spec)
    except ValueError as e:
        return DemandAnswer(
            None, f"demand at {demand_at} ignored: the autoscaling spec is invalid: {e}", DEMAND_IGNORED
        )
    if not autoscaling.enabled or not autoscaling.scale_to_zero:
        return DemandAnswer(
            None,
            f"demand at {demand_at} ignored: scale to zero is off (it needs minReplicas: 0"
            " and autoscaling.enabled); spec.replicas is left to its owner",
            DEMAND_IGNORED,
        )
    current = spec.get("replicas", 1)
    if current != 0:
        return DemandAnswer(
            None,
            f"demand at {demand_at}: {current} replicas already (starting, or asleep in"
            " standby: the router wakes those itself)",
        )
    return DemandAnswer(
        1, f"the router holds requests and has no engine (demand at {demand_at}): 0 -> 1 replica", SCALED_FROM_ZERO
    )


@kopf.on.field(API_GROUP, API_VERSION, PLURAL, field=("metadata", "annotations", DEMAND_ANNOTATION), registry=REGISTRY)
async def on_demand(
    new: Any, body: kopf.Body, name: str, namespace: str, memo: Any, logger: logging.Logger, **_: Any
) -> None:
    if not isinstance(new, str) or not new:
        return
    answer = answer_demand(dict(body.get("spec") or {}), new)
    if answer.replicas is None:
        logger.info("autoscaling: %s", answer.reason)
        if answer.event:
            kopf.event(body, type="Normal", reason=answer.event, message=answer.reason)
        return
    kube = runtime_of(memo).kube
    try:
        await kube.patch(
            INFERENCESERVICES, namespace, name, {"spec": {"replicas": answer.replicas}}, subresource="scale"
        )
    except KubeApiError as e:  # the router writes again while requests wait; the daemon's round also reads its queue
        logger.warning("autoscaling: cannot scale from zero on demand: %s", e)
        return
    memory = memory_of(memo)
    memory.idle_state, memory.idle_since = IdleState(), None
    kopf.event(body, type="Normal", reason=answer.event, message=answer.reason)
    logger.info("autoscaling: %s", answer.reason)
    status = {"desiredReplicas": answer.replicas, "lastScaleTime": now_rfc3339(), "lastScaleReason": answer.reason}
    memory.last_scale = {key: status[key] for key in ("lastScaleTime", "lastScaleReason")}
    try:
        await kube.patch(INFERENCESERVICES, namespace, name, {"status": {"autoscaling": status}}, subresource="status")
    except KubeApiError as e:
        logger.warning("autoscaling: cannot write status: %s", e)
