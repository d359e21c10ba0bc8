"""Apply an InferenceService's children (its Deployment and Service) and keep them as built.

`apply_children` is the only writer of children:

1. GET both children first. One that exists without this InferenceService
   as its controller is a name clash: `NotApplied(ChildConflict)` names it
   and nothing is created or patched, so a clash never leaves half a pair.
2. An absent child is POSTed (a 409 from a concurrent create falls back to
   a GET and the same ownership check).
3. A present child is PATCHed with `builders.patch_for(desired)` when a
   field the operator owns differs (`drift.drifted_paths`): the spec-hash
   annotation, when the desired spec changed, or any field someone edited by
   hand (an image, a container, replicas, a key added to a map the operator
   owns whole, `builders.CLOSED_MAPS`). What the API server defaults and
   what other controllers add elsewhere is not compared, so they never cause
   a patch.
   With `keep_replicas` (spec.autoscaling.enabled) a Deployment's
   `spec.replicas` alone is never drift: the autoscaler moves it through the
   owner's scale subresource, and a new spec-hash carries that.

A write the API server refuses and would refuse again (`ApiError.retryable`
False: 400, 403, 422, from validation, RBAC or an admission webhook) is
`NotApplied(ApplyFailed)` carrying the server's message and no retry delay;
every other ApiError propagates, and the reconcile is retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from pagedinfer.operator import builders, status
from pagedinfer.operator.drift import drifted_paths
from pagedinfer.operator.kube_api import DEPLOYMENTS, SERVICES, ApiError, KubeApi, ResourceRef

REPLICAS_PATH = "spec.replicas"


class NotApplied(Exception):
    """The children could not be applied: `reason` is the Applied condition's reason.

    retry_seconds: None when retrying the same spec cannot help. deployed:
    whether this InferenceService's Deployment exists; the message says when
    it keeps serving the spec applied before.
    """

    def __init__(self, reason: str, message: str, retry_seconds: float | None, deployed: bool) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_seconds, self.deployed = reason, message, retry_seconds, deployed


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `uid` is the controller in obj's ownerReferences."""
    return any(ref.get("uid") == uid and ref.get("controller") for ref in obj["metadata"].get("ownerReferences") or [])


def describe(manifest: Mapping[str, Any]) -> str:
    """`Deployment default/llama`: how messages name a child."""
    meta = manifest["metadata"]
    return f"{manifest['kind']} {meta['namespace']}/{meta['name']}"


def _conflict(manifests: list[Mapping[str, Any]], retry_seconds: float, deployed: bool,
              unchanged: bool) -> NotApplied:
    many = len(manifests) > 1
    message = (f"{' and '.join(describe(m) for m in manifests)} already {'exist' if many else 'exists'} and "
               f"{'are' if many else 'is'} not controlled by this InferenceService: delete or rename "
               f"{'them' if many else 'it'}, or rename the InferenceService.")
    return NotApplied(status.REASON_CHILD_CONFLICT, message + (status.KEEPS_SERVING if unchanged else ""),
                      retry_seconds, deployed)


async def _write(call: Callable[[], Awaitable[dict[str, Any]]], desired: Mapping[str, Any], deployed: bool,
                 unchanged: bool) -> dict[str, Any]:
    try:
        return await call()
    except ApiError as exc:
        if exc.retryable:
            raise
        message = f"The API server refused {describe(desired)}: {exc}" + (status.KEEPS_SERVING if unchanged else "")
        raise NotApplied(status.REASON_APPLY_FAILED, message, None, deployed) from exc


@dataclass(frozen=True)
class Ownership:
    """Whose children these are and what the operator leaves to others."""

    owner_uid: str
    keep_replicas: bool  # spec.autoscaling.enabled: a Deployment's spec.replicas alone is never drift
    conflict_retry_seconds: float  # a ChildConflict ends when someone deletes or renames the other object


async def apply_children(api: KubeApi, ownership: Ownership, deployment: dict[str, Any], service: dict[str, Any],
                         logger: Any) -> list[dict[str, Any]]:
    """Make both children match; returns them as the API server now has them (Deployment, Service)."""
    children: list[tuple[ResourceRef, dict[str, Any]]] = [(DEPLOYMENTS, deployment), (SERVICES, service)]
    found = [await api.get(ref, desired["metadata"]["namespace"], desired["metadata"]["name"])
             for ref, desired in children]
    deployed = found[0] is not None and owned_by(found[0], ownership.owner_uid)
    foreign = [desired for (_, desired), live in zip(children, found)
               if live is not None and not owned_by(live, ownership.owner_uid)]
    if foreign:
        raise _conflict(foreign, ownership.conflict_retry_seconds, deployed, unchanged=deployed)
    applied = []
    for (ref, desired), live in zip(children, found):
        applied.append(await _apply_one(api, ownership, ref, desired, live, deployed, logger))
        deployed = True  # the Deployment comes first
    return applied


async def _apply_one(api: KubeApi, ownership: Ownership, ref: ResourceRef, desired: dict[str, Any],
                     live: dict[str, Any] | None, deployed: bool, logger: Any) -> dict[str, Any]:
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    if live is None:
        try:
            return await _write(lambda: api.create(ref, namespace, desired), desired, deployed, unchanged=False)
        except ApiError as exc:
            if exc.status != 409:
                raise
        live = await api.get(ref, namespace, name)
        if live is None:
            raise ApiError(409, "Conflict", f"{describe(desired)} was created and deleted concurrently")
        if not owned_by(live, ownership.owner_uid):
            raise _conflict([desired], ownership.conflict_retry_seconds, deployed, unchanged=False)
    patch = builders.patch_for(desired, live)
    ignored = {REPLICAS_PATH} if ownership.keep_replicas else set()
    drifted = [path for path in drifted_paths(live, patch) if path not in ignored]
    if not drifted:
        return live
    logger.info(f"Patching {describe(desired)}: {', '.join(drifted)} differ from the spec.")
    return await _write(lambda: api.patch(ref, namespace, name, patch), desired, deployed,
                        unchanged=deployed and ref == DEPLOYMENTS)
