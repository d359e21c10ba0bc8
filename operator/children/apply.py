"""Apply an InferenceService's children (its Deployment and Service) and keep them as built.

`apply_children` is the only writer of children:

1. GET both children first. One that exists without this InferenceService
   as its controller is a name clash: `NotApplied(ChildConflict)` names it
   and nothing is created or patched, so a clash never leaves half a pair.
   Except an orphan the operator built for this InferenceService (no
   controller at all, and its `serving.pagedinfer.dev/inferenceservice` and
   `app.kubernetes.io/managed-by` labels: after `kubectl delete
   --cascade=orphan` and a new InferenceService of that name, or an
   ownerReference removed by hand): it is adopted, its controller reference
   put back by the patch of step 3.
2. An absent child is POSTed (a 409 from a concurrent create falls back to
   a GET and the same ownership check).
3. A present child is PATCHed with `drift.patch_for(desired)` when a
   field the operator owns differs (`drift.drifted_paths`): the spec-hash or
   owner-generation annotation, when the desired spec changed, or any field
   someone edited by hand (an image, a container, replicas, a key added to a
   map the operator owns whole, `drift.CLOSED_MAPS`). What the API server
   defaults or spells its own way (quantities) and what other controllers add
   elsewhere is not compared, so they never cause a patch.
   With `keep_replicas` (spec.autoscaling.enabled) a Deployment's
   `spec.replicas` alone is never drift: the autoscaler moves it through the
   owner's scale subresource, and a new spec-hash carries that.

Every child as the API server now has it (found as built, created or
patched) goes to `on_applied` at once, also when the other child then fails,
so the caller knows the operator's own writes (`Runtime.child_fingerprints`).

A write the API server refuses and would refuse again (`KubeApiError.retryable`
False: 400, 403, 422, from validation, RBAC or an admission webhook) is
`NotApplied(ApplyFailed)` carrying the server's message and no retry delay.
A 403 for an exceeded ResourceQuota passes once something else is deleted or
the quota is raised: `NotApplied(QuotaExceeded)`, retried after
`Ownership.wait_retry_seconds`. Every other KubeApiError propagates, and the
reconcile is retried.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagedinfer.operator.children.drift import drifted_paths, patch_for
from pagedinfer.operator.children.labels import MANAGED_BY, MANAGED_BY_LABEL, OWNER_LABEL
from pagedinfer.operator.kube_api import DEPLOYMENTS, SERVICES, KubeApi, KubeApiError, ResourceRef
from pagedinfer.operator.status import conditions

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


def adoptable(obj: Mapping[str, Any], owner_name: str) -> bool:
    """Whether obj is an orphan the operator built for the InferenceService `owner_name`.

    No controller of any kind (a child another controller claims is never
    taken), and the operator's managed-by and owner labels naming `owner_name`.
    """
    meta = obj["metadata"]
    labels = meta.get("labels") or {}
    return (
        not any(ref.get("controller") for ref in meta.get("ownerReferences") or [])
        and labels.get(MANAGED_BY_LABEL) == MANAGED_BY
        and labels.get(OWNER_LABEL) == owner_name
    )


def describe(manifest: Mapping[str, Any]) -> str:
    """`Deployment default/llama`: how messages name a child."""
    meta = manifest["metadata"]
    return f"{manifest['kind']} {meta['namespace']}/{meta['name']}"


def _conflict(manifests: list[Mapping[str, Any]], retry_seconds: float, deployed: bool, unchanged: bool) -> NotApplied:
    many = len(manifests) > 1
    message = (
        f"{' and '.join(describe(m) for m in manifests)} already {'exist' if many else 'exists'} and "
        f"{'are' if many else 'is'} not controlled by this InferenceService: delete or rename "
        f"{'them' if many else 'it'}, or rename the InferenceService."
    )
    return NotApplied(
        conditions.REASON_CHILD_CONFLICT,
        message + (conditions.KEEPS_SERVING if unchanged else ""),
        retry_seconds,
        deployed,
    )


async def _write(
    call: Callable[[], Awaitable[dict[str, Any]]],
    desired: Mapping[str, Any],
    deployed: bool,
    unchanged: bool,
    wait_retry_seconds: float,
) -> dict[str, Any]:
    try:
        return await call()
    except KubeApiError as exc:
        if exc.retryable:
            raise
        keeps_serving = conditions.KEEPS_SERVING if unchanged else ""
        if exc.quota_exceeded:
            message = (
                f"A ResourceQuota refused {describe(desired)}: {exc}. Retried every "
                f"{wait_retry_seconds:g} s until the quota allows it (raise the quota or free some of it)."
                + keeps_serving
            )
            raise NotApplied(conditions.REASON_QUOTA_EXCEEDED, message, wait_retry_seconds, deployed) from exc
        message = f"The API server refused {describe(desired)}: {exc}" + keeps_serving
        raise NotApplied(conditions.REASON_APPLY_FAILED, message, None, deployed) from exc


@dataclass(frozen=True)
class Ownership:
    """Whose children these are and what the operator leaves to others."""

    owner_uid: str
    owner_name: str  # the children's name, and their owner label's value (an orphan with it is adopted)
    keep_replicas: bool  # spec.autoscaling.enabled: a Deployment's spec.replicas alone is never drift
    # Waiting on others: a ChildConflict ends when someone deletes or renames the other object,
    # a QuotaExceeded when the namespace's ResourceQuota has room again.
    wait_retry_seconds: float

    def claims(self, live: Mapping[str, Any]) -> bool:
        """Whether live is this owner's child: it is the controller, or live is an orphan to adopt."""
        return owned_by(live, self.owner_uid) or adoptable(live, self.owner_name)


async def apply_children(
    api: KubeApi,
    ownership: Ownership,
    deployment: dict[str, Any],
    service: dict[str, Any],
    logger: Any,
    on_applied: Callable[[dict[str, Any]], None],
    extra: Sequence[tuple[ResourceRef, dict[str, Any]]] = (),
) -> list[dict[str, Any]]:
    """Make the children match; returns them as the API server now has them (Deployment, Service, *extra).

    extra: more children (the router's, `routing.builders.router_children`), checked for clashes with
    the first two and applied after them in order."""
    children: list[tuple[ResourceRef, dict[str, Any]]] = [(DEPLOYMENTS, deployment), (SERVICES, service), *extra]
    found = [
        await api.get(ref, desired["metadata"]["namespace"], desired["metadata"]["name"]) for ref, desired in children
    ]
    deployed = found[0] is not None and ownership.claims(found[0])
    foreign = [
        desired for (_, desired), live in zip(children, found) if live is not None and not ownership.claims(live)
    ]
    if foreign:
        raise _conflict(foreign, ownership.wait_retry_seconds, deployed, unchanged=deployed)
    applied = []
    for (ref, desired), live in zip(children, found):
        applied.append(await _apply_one(api, ownership, ref, desired, live, deployed, logger))
        on_applied(applied[-1])
        deployed = True  # the Deployment comes first
    return applied


async def _apply_one(
    api: KubeApi,
    ownership: Ownership,
    ref: ResourceRef,
    desired: dict[str, Any],
    live: dict[str, Any] | None,
    deployed: bool,
    logger: Any,
) -> dict[str, Any]:
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    wait = ownership.wait_retry_seconds
    if live is None:
        try:
            return await _write(lambda: api.create(ref, namespace, desired), desired, deployed, False, wait)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
        live = await api.get(ref, namespace, name)
        if live is None:
            raise KubeApiError(409, "Conflict", f"{describe(desired)} was created and deleted concurrently")
        if not ownership.claims(live):
            raise _conflict([desired], wait, deployed, unchanged=False)
    if not owned_by(live, ownership.owner_uid):
        logger.info(
            f"Adopting {describe(desired)}: it has no controller and carries this InferenceService's "
            "labels; its controller reference is put back."
        )
    patch = patch_for(desired, live)
    ignored = {REPLICAS_PATH} if ownership.keep_replicas else set()
    drifted = [path for path in drifted_paths(live, patch) if path not in ignored]
    if not drifted:
        return live
    logger.info(f"Patching {describe(desired)}: {', '.join(drifted)} differ from the spec.")
    return await _write(
        lambda: api.patch(ref, namespace, name, patch), desired, deployed, deployed and ref == DEPLOYMENTS, wait
    )
