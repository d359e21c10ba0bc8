"""Events of the children the operator manages (Deployments and Services).

kopf watches Deployments, filtered by `app.kubernetes.io/managed-by`
(handlers.py), and hands every event of a child whose controller is an
InferenceService to `on_child_event`:

- DELETED while the owner lives (not by the garbage collector): the owner is
  reconciled, which creates the child again.
- every Deployment event: its state goes into the owner's status (replicas,
  readyReplicas, Available and Ready, with the owner's generation).
"""

from __future__ import annotations

from typing import Any, Mapping

import kopf

from pagedinfer.operator import status
from pagedinfer.operator.kube_api import INFERENCESERVICES, ApiError
from pagedinfer.operator.reconciler import reconcile
from pagedinfer.operator.settings import Runtime
from pagedinfer.operator.status_writer import write_conditions


def _controller(child: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = [r for r in child["metadata"].get("ownerReferences") or []
            if r.get("kind") == "InferenceService" and r.get("controller")]
    return refs[0] if refs else None


async def _live_owner(runtime: Runtime, namespace: str, ref: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner, when it still exists (same uid) and is not being deleted."""
    owner = await runtime.kube.get(INFERENCESERVICES, namespace, ref["name"])
    if owner is None or owner["metadata"]["uid"] != ref["uid"] or owner["metadata"].get("deletionTimestamp"):
        return None
    return owner


async def on_child_event(runtime: Runtime, kind: str, child: Mapping[str, Any], event_type: str | None,
                         logger: Any) -> None:
    """One watch event of a managed `kind` ("Deployment" or "Service") child."""
    ref = _controller(child)
    if ref is None:
        return
    meta = child["metadata"]
    what, namespace = f"{kind} {meta['name']}", meta["namespace"]
    if event_type == "DELETED":
        if (owner := await _live_owner(runtime, namespace, ref)) is not None:
            logger.info(f"{what} was deleted; creating it again.")
            await reconcile(runtime, owner, logger)
        return
    if kind == "Deployment":
        await report_rollout(runtime, child, ref)


async def report_rollout(runtime: Runtime, deployment: Mapping[str, Any], ref: Mapping[str, Any]) -> None:
    """Carry a Deployment's state into its owner's status (replicas, readyReplicas, Available, Ready)."""
    rollout = status.Rollout.from_deployment(deployment)
    try:
        owner = await _live_owner(runtime, deployment["metadata"]["namespace"], ref)
        if owner is None:
            return
        generation = owner["metadata"].get("generation")
        await write_conditions(runtime.kube, owner, list(status.rollout_conditions(rollout)), generation,
                               **status.rollout_status(rollout))
    except ApiError as exc:
        raise kopf.TemporaryError(f"cannot write the rollout status: {exc}",
                                  delay=runtime.config.retry_delay_seconds) from exc
