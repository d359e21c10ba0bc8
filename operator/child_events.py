"""Events of the children the operator manages (Deployments and Services).

kopf watches both kinds, filtered by `app.kubernetes.io/managed-by`
(handlers.py), and hands every event of a child whose controller is an
InferenceService to `on_child_event`:

- DELETED while the owner lives (not by the garbage collector): the owner is
  reconciled, which creates the child again.
- MODIFIED with a fingerprint (`drift.fingerprint`) other than the one
  recorded in `Runtime.child_fingerprints`: someone else changed the child
  (`kubectl edit`, `kubectl scale`, a new image). The owner is
  reconciled, which patches the fields the operator owns back
  (`children.apply_children`). The operator's own writes record their
  fingerprint, and status writes do not change it, so neither costs a
  reconcile. The fingerprint is recorded before that reconcile, so an owner
  that cannot be applied (an invalid spec) is not reconciled on every event,
  and forgotten when the reconcile fails, so the next event tries again.
  ADDED is the operator's own create (its fingerprint may not be recorded
  yet), and the listing kopf does at start (event type None) is left to the
  owners' resume handler, which reconciles every InferenceService anyway.
- every Deployment event: its state goes into the owner's status (replicas,
  readyReplicas, Available and Ready, with the owner's generation).
"""

from __future__ import annotations

from typing import Any, Mapping

import kopf

from pagedinfer.operator import status
from pagedinfer.operator.drift import fingerprint
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
    what, namespace, uid = f"{kind} {meta['name']}", meta["namespace"], meta["uid"]
    seen = fingerprint(child)
    if event_type == "DELETED":
        runtime.child_fingerprints.pop(uid, None)
        if (owner := await _live_owner(runtime, namespace, ref)) is not None:
            logger.info(f"{what} was deleted; creating it again.")
            await reconcile(runtime, owner, logger)
        return
    if event_type == "MODIFIED" and runtime.child_fingerprints.get(uid) != seen:
        runtime.child_fingerprints[uid] = seen
        if (owner := await _live_owner(runtime, namespace, ref)) is not None:
            logger.info(f"{what} was changed outside the operator; reconciling {ref['name']}.")
            try:
                await reconcile(runtime, owner, logger)
            except Exception:
                runtime.child_fingerprints.pop(uid, None)
                raise
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
