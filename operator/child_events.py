"""Events of the children the operator manages (Deployments and Services).

kopf watches both kinds, filtered by `app.kubernetes.io/managed-by`
(handlers.py), and hands every event to `on_child_event`. A child belongs
to the InferenceService that is its controller, or, with no controller at
all, to the one its owner label names (an orphan the operator built:
`children.adoptable`, which that owner's reconcile adopts).

- DELETED: the child's fingerprint is forgotten, whoever owned it. While
  its owner lives (the child was not deleted by the garbage collector), the
  owner is reconciled, which creates the child again.
- MODIFIED with a fingerprint (`drift.fingerprint`: what the operator owns
  of the child) other than the one recorded in `Runtime.child_fingerprints`:
  someone else changed the child (`kubectl edit`, `kubectl scale`, a new
  image, a removed ownerReference). The owner is reconciled, which patches
  the fields the operator owns back (`children.apply_children`). The
  operator's own writes record their fingerprint, and status writes and
  other controllers' metadata (`deployment.kubernetes.io/revision`) do not
  change it, so none of them costs a reconcile. The fingerprint is recorded
  before that reconcile and kept when it fails for good (a
  kopf.PermanentError: ApplyFailed) or for an unexpected error, so a child
  whose owner cannot be applied is not reconciled again on every status
  event ("not retried until the spec changes"); it is forgotten when the
  reconcile fails with a kopf.TemporaryError (or the owner cannot be read),
  so the next event tries again.
  ADDED is the operator's own create (its fingerprint may not be recorded
  yet), and the listing kopf does at start (event type None) is left to the
  owners' resume handler, which reconciles every InferenceService anyway.
- every event of the router Deployment (`NAME-router`): its ready pods go
  into the owner's status.routing.readyReplicas.
- every event of the engine Deployment (named as its owner), whatever that reconcile
  did: its state goes into the owner's status (replicas, readyReplicas,
  Available and Ready, for the owner generation the Deployment was built
  from, `builders.built_for_generation`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from pagedinfer.operator.children.apply import adoptable
from pagedinfer.operator.children.builders import built_for_generation
from pagedinfer.operator.children.drift import fingerprint
from pagedinfer.operator.kube_api import INFERENCESERVICES, KubeApiError
from pagedinfer.operator.reconciler import reconcile
from pagedinfer.operator.routing.builders import router_name
from pagedinfer.operator.routing.status import router_ready
from pagedinfer.operator.settings import Runtime
from pagedinfer.operator.status import conditions
from pagedinfer.operator.status.writer import write_conditions


def _owner_of(child: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """(name, uid) of the controlling InferenceService; (name, None) for an orphan its labels name; else None."""
    meta = child["metadata"]
    controllers = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
    if controllers:
        ref = controllers[0]
        return (ref["name"], ref["uid"]) if ref.get("kind") == "InferenceService" else None
    return (meta["name"], None) if adoptable(child, meta["name"]) else None


async def _live_owner(runtime: Runtime, namespace: str, name: str, uid: str | None) -> dict[str, Any] | None:
    """The owner, when it exists (with `uid`, unless None) and is not being deleted."""
    owner = await runtime.kube.get(INFERENCESERVICES, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return None
    return owner if uid is None or owner["metadata"]["uid"] == uid else None


async def on_child_event(
    runtime: Runtime,
    kind: str,
    child: Mapping[str, Any],
    event_type: str | None,
    logger: Any,
    nodes: Iterable[Mapping[str, Any]],
) -> None:
    """One watch event of a managed `kind` ("Deployment" or "Service") child."""
    meta = child["metadata"]
    what, namespace, uid = f"{kind} {meta['name']}", meta["namespace"], meta["uid"]
    if event_type == "DELETED":
        runtime.child_fingerprints.pop(uid, None)
    owner_of = _owner_of(child)
    if owner_of is None:
        return
    name, owner_uid = owner_of
    if event_type == "DELETED":
        if (owner := await _live_owner(runtime, namespace, name, owner_uid)) is not None:
            logger.info(f"{what} was deleted; creating it again.")
            await reconcile(runtime, owner, logger, nodes)
        return
    try:
        seen = fingerprint(child)
        if event_type == "MODIFIED" and runtime.child_fingerprints.get(uid) != seen:
            runtime.child_fingerprints[uid] = seen
            try:
                if (owner := await _live_owner(runtime, namespace, name, owner_uid)) is not None:
                    why = "was changed outside the operator" if owner_uid else "has no controller"
                    logger.info(f"{what} {why}; reconciling {name}.")
                    await reconcile(runtime, owner, logger, nodes)
            except (kopf.TemporaryError, KubeApiError):
                runtime.child_fingerprints.pop(uid, None)
                raise
    finally:
        if kind == "Deployment" and owner_uid is not None and meta["name"] == name:
            await report_rollout(runtime, child, name, owner_uid)
        elif kind == "Deployment" and owner_uid is not None and meta["name"] == router_name(name):
            await report_router_rollout(runtime, child, name, owner_uid)


async def report_router_rollout(
    runtime: Runtime, deployment: Mapping[str, Any], owner_name: str, owner_uid: str
) -> None:
    """The router Deployment's ready pods into its owner's status.routing.readyReplicas."""
    try:
        owner = await _live_owner(runtime, deployment["metadata"]["namespace"], owner_name, owner_uid)
        if owner is None or not (owner.get("status") or {}).get("routing", {}).get("enabled"):
            return
        await write_conditions(
            runtime.kube, owner, [], None, routing={**owner["status"]["routing"], **router_ready(deployment)}
        )
    except KubeApiError as exc:
        raise kopf.TemporaryError(
            f"cannot write the routing status: {exc}", delay=runtime.config.retry_delay_seconds
        ) from exc


async def report_rollout(runtime: Runtime, deployment: Mapping[str, Any], owner_name: str, owner_uid: str) -> None:
    """Carry a Deployment's state into its owner's status (replicas, readyReplicas, Available, Ready).

    Available and Ready are stamped with the generation the Deployment was
    built from, not the owner's current one: while an update is pending or
    refused, they describe the spec still served.
    """
    rollout = conditions.Rollout.from_deployment(deployment)
    try:
        owner = await _live_owner(runtime, deployment["metadata"]["namespace"], owner_name, owner_uid)
        if owner is None:
            return
        await write_conditions(
            runtime.kube,
            owner,
            list(conditions.rollout_conditions(rollout)),
            built_for_generation(deployment),
            **conditions.rollout_status(rollout),
        )
    except KubeApiError as exc:
        raise kopf.TemporaryError(
            f"cannot write the rollout status: {exc}", delay=runtime.config.retry_delay_seconds
        ) from exc
