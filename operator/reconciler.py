"""One reconcile of an InferenceService, and the rollout report from its Deployment.

reconcile(): parse the spec (invalid: Valid=False, an Event, no children) ->
plan the KV cache (cannot: Sized=False with the numbers, an Event, no
children; retried later when waiting can help) -> build the Deployment and
Service (pure) -> apply each idempotently -> write status.

Idempotent apply: GET the child; absent -> POST (a 409 from a concurrent
create falls back to GET); present -> PATCH only when the spec-hash
annotation differs, and never a child another owner controls. An unchanged
service therefore costs GETs only; a restarted operator finds its children
by name and creates no duplicates.

Status is written with our own client to `/status`, as a merge patch
guarded by `metadata.resourceVersion` (409 -> re-read and recompute), so the
two writers never lose each other's fields: reconcile() owns Valid, Sized,
kvCache, url, selector, observedGeneration; report_rollout() (on every
Deployment event) owns replicas, readyReplicas, Available and Ready.
Neither writes `spec.replicas`: HPA, KEDA or the autoscaler own it through
the scale subresource, and the next reconcile carries it to the Deployment.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Mapping

import kopf

from pagedinfer.operator import builders, sizer, status
from pagedinfer.operator.crd_model import InferenceServiceSpec, SpecError
from pagedinfer.operator.spec_parser import parse_spec
from pagedinfer.operator.kube_api import DEPLOYMENTS, INFERENCESERVICES, SERVICES, ApiError, KubeApi, ResourceRef
from pagedinfer.operator.settings import Runtime

MAX_STATUS_ATTEMPTS = 5
KEEPS_SERVING = (" The Deployment keeps serving the last applied spec, unchanged; status.kvCache is "
                 "its plan.")


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid and ref.get("controller") for ref in obj["metadata"].get("ownerReferences") or [])


async def _serving_deployment(api: KubeApi, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
    """This InferenceService's Deployment, when one exists (it keeps serving what was last applied)."""
    deployed = await api.get(DEPLOYMENTS, namespace, name)
    return deployed if deployed is not None and _owned_by(deployed, uid) else None


def _spec_hash(obj: Mapping[str, Any]) -> str | None:
    return (obj.get("metadata", {}).get("annotations") or {}).get(builders.SPEC_HASH_ANNOTATION)


async def apply_child(api: KubeApi, ref: ResourceRef, desired: dict[str, Any], owner_uid: str) -> dict[str, Any]:
    meta = desired["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    current = await api.get(ref, namespace, name)
    if current is None:
        try:
            return await api.create(ref, namespace, desired)
        except ApiError as exc:
            if exc.status != 409:
                raise
            current = await api.get(ref, namespace, name)
            if current is None:
                raise
    if not _owned_by(current, owner_uid):
        raise kopf.TemporaryError(f"{desired['kind']} {name} exists and is not controlled by this "
                                  f"InferenceService; delete or rename it.", delay=60)
    if _spec_hash(current) == _spec_hash(desired):
        return current
    return await api.patch(ref, namespace, name, builders.patch_for(desired))


async def update_status(api: KubeApi, namespace: str, name: str,
                        change: Callable[[dict[str, Any]], dict[str, Any]],
                        known: Mapping[str, Any] | None = None) -> None:
    """Apply `change` to the current status with optimistic concurrency (409 -> re-read)."""
    body = known
    for _ in range(MAX_STATUS_ATTEMPTS):
        if body is None:
            body = await api.get(INFERENCESERVICES, namespace, name)
            if body is None:
                return
        old = dict(body.get("status") or {})
        new = change(copy.deepcopy(old))
        if new == old:
            return
        patch_status = {**{key: None for key in old if key not in new}, **new}
        try:
            await api.patch(INFERENCESERVICES, namespace, name, {
                "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                "status": patch_status,
            }, subresource="status")
            return
        except ApiError as exc:
            if exc.status == 404:
                return
            if exc.status != 409:
                raise
            body = None
    raise ApiError(409, "Conflict", f"status of {namespace}/{name} kept changing; will retry")


def _with_conditions(old: dict[str, Any], updates: list[status.Condition], generation: int | None,
                     **fields: Any) -> dict[str, Any]:
    new = {**old, **{k: v for k, v in fields.items() if v is not None}}
    for key in (k for k, v in fields.items() if v is None):
        new.pop(key, None)
    new["conditions"] = status.merge_conditions(old.get("conditions"), updates, generation, status.now_rfc3339())
    new["phase"] = status.phase_for(new["conditions"])
    return new


def _is_news(body: Mapping[str, Any], type_: str, reason: str, message: str) -> bool:
    """Whether a condition differs from what status already says (post an Event only then)."""
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return (c.get("reason"), c.get("message")) != (reason, message)
    return True


def _same_conditions(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Keep `old` when only timestamps would change (no pointless writes)."""
    strip = lambda s: {**s, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}  # noqa: E731
                                           for c in s.get("conditions") or []]}
    return old if strip(old) == strip(new) else new


async def reconcile(runtime: Runtime, body: Mapping[str, Any], logger: Any) -> None:
    started = time.monotonic()
    api = runtime.kube
    calls_before = api.calls
    meta = body["metadata"]
    name, namespace, uid, generation = meta["name"], meta["namespace"], meta["uid"], meta.get("generation")
    result = "retry"
    try:
        result = await _reconcile(runtime, api, body, name, namespace, uid, generation, logger)
    except ApiError as exc:
        runtime.metrics.errors.labels(reason=f"api_{exc.status or 'network'}").inc()
        raise kopf.TemporaryError(f"Kubernetes API error, will retry: {exc}",
                                  delay=runtime.config.retry_delay_seconds) from exc
    except kopf.TemporaryError:
        runtime.metrics.errors.labels(reason="temporary").inc()
        raise
    finally:
        runtime.metrics.reconciles.labels(result=result).inc()
        runtime.metrics.duration.observe(time.monotonic() - started)
        runtime.metrics.api_requests.inc(api.calls - calls_before)


async def _reconcile(runtime: Runtime, api: KubeApi, body: Mapping[str, Any], name: str, namespace: str,
                     uid: str, generation: int | None, logger: Any) -> str:
    try:
        spec = parse_spec(name, body.get("spec"),
                          allow_host_path_models=runtime.config.allow_host_path_models)
    except SpecError as exc:
        serving = await _serving_deployment(api, namespace, name, uid)
        message = f"Invalid spec: {exc}" + (KEEPS_SERVING if serving is not None else "")
        if _is_news(body, status.VALID, status.REASON_INVALID_SPEC, message):
            kopf.warn(dict(body), reason=status.REASON_INVALID_SPEC, message=message)
            logger.warning(message)
        await update_status(api, namespace, name, lambda old: _same_conditions(old, _with_conditions(
            old, [status.false(status.VALID, status.REASON_INVALID_SPEC, message)], generation,
            observedGeneration=generation)), known=body)
        return "invalid"
    valid = status.true(status.VALID, status.REASON_SPEC_VALID, "The spec is valid.")
    owner = builders.Owner(name=name, namespace=namespace, uid=uid)
    try:
        plan, sized_note = await sizer.plan(runtime, spec, namespace)
    except sizer.SizingFailure as failure:
        return await _report_unsized(api, body, spec, failure, valid, generation, logger)
    deployment = await apply_child(api, DEPLOYMENTS, builders.build_deployment(owner, spec, plan), uid)
    await apply_child(api, SERVICES, builders.build_service(owner), uid)
    sized = status.true(status.SIZED, status.SIZED_REASONS[plan.source], sized_note)
    logger.info(f"Applied Deployment {deployment['metadata']['name']}: {sized.message}")
    await update_status(api, namespace, name, lambda old: _same_conditions(old, _with_conditions(
        old, [valid, sized], generation, observedGeneration=generation, kvCache=plan.to_status(),
        selector=builders.selector_string(name), url=builders.service_url(owner))), known=body)
    return "applied"


async def _report_unsized(api: KubeApi, body: Mapping[str, Any], spec: InferenceServiceSpec,
                          failure: sizer.SizingFailure, valid: status.Condition, generation: int | None,
                          logger: Any) -> str:
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    deployed = await _serving_deployment(api, namespace, name, meta["uid"])
    message = failure.message + (KEEPS_SERVING if deployed is not None else "")
    sized = status.false(status.SIZED, failure.reason, message)
    updates = [valid, sized]
    if deployed is None:
        updates += list(status.rollout_conditions(None))
    if _is_news(body, status.SIZED, failure.reason, message):
        kopf.warn(dict(body), reason=failure.reason, message=message)
        logger.warning(f"{failure.reason}: {message}")
    # With a Deployment still serving, status.kvCache keeps describing its plan.
    not_deployed = {"kvCache": None, **status.rollout_status(None)} if deployed is None else {}
    await update_status(api, namespace, name, lambda old: _same_conditions(old, _with_conditions(
        old, updates, generation, observedGeneration=generation, **not_deployed)), known=body)
    if failure.retry_seconds is not None:
        raise kopf.TemporaryError(failure.message, delay=failure.retry_seconds)
    return "unsized"


async def report_rollout(runtime: Runtime, deployment: Mapping[str, Any], event_type: str | None,
                         logger: Any) -> None:
    """Carry a Deployment's state into its owner's status (replicas, readyReplicas, Available, Ready).

    A Deployment deleted while its owner lives (not by the garbage collector)
    is recreated by reconciling the owner again.
    """
    api = runtime.kube
    meta = deployment["metadata"]
    owner_refs = [r for r in meta.get("ownerReferences") or [] if r.get("kind") == "InferenceService"
                  and r.get("controller")]
    if not owner_refs:
        return
    owner_name, namespace, owner_uid = owner_refs[0]["name"], meta["namespace"], owner_refs[0]["uid"]
    if event_type == "DELETED":
        owner = await api.get(INFERENCESERVICES, namespace, owner_name)
        if owner is not None and owner["metadata"]["uid"] == owner_uid \
                and not owner["metadata"].get("deletionTimestamp"):
            logger.info(f"Deployment {meta['name']} was deleted; recreating it.")
            await reconcile(runtime, owner, logger)
        return
    rollout = status.Rollout.from_deployment(deployment)
    available, ready = status.rollout_conditions(rollout)
    try:
        owner = await api.get(INFERENCESERVICES, namespace, owner_name)
        if owner is None or owner["metadata"]["uid"] != owner_uid:
            return
        generation = owner["metadata"].get("generation")
        await update_status(api, namespace, owner_name, lambda old: _same_conditions(old, _with_conditions(
            old, [available, ready], generation, **status.rollout_status(rollout))), known=owner)
    except ApiError as exc:
        raise kopf.TemporaryError(f"cannot write the rollout status: {exc}",
                                  delay=runtime.config.retry_delay_seconds) from exc
