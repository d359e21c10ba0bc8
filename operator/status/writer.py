"""Writing an InferenceService's status: merge patches to `/status` that never lose a field.

Two writers share the status: the reconcile (Valid, Sized, Applied, kvCache,
url, selector, observedGeneration) and the rollout report (replicas,
readyReplicas, Available, Ready); the autoscaler writes `status.autoscaling`
alone. Each write is a merge patch guarded by `metadata.resourceVersion`
(409 -> re-read and recompute), so none loses another's fields, and a write
that would change only timestamps is not sent.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from pagedinfer.operator.kube_api import INFERENCESERVICES, KubeApi, KubeApiError
from pagedinfer.operator.status import conditions

MAX_STATUS_ATTEMPTS = 5


async def update_status(
    api: KubeApi,
    namespace: str,
    name: str,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    known: Mapping[str, Any] | None = None,
) -> None:
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
            await api.patch(
                INFERENCESERVICES,
                namespace,
                name,
                {
                    "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                    "status": patch_status,
                },
                subresource="status",
            )
            return
        except KubeApiError as exc:
            if exc.status == 404:
                return
            if exc.status != 409:
                raise
            body = None
    raise KubeApiError(409, "Conflict", f"status of {namespace}/{name} kept changing; will retry")


async def write_conditions(
    api: KubeApi, body: Mapping[str, Any], updates: list[conditions.Condition], generation: int | None, **fields: Any
) -> None:
    """Merge `updates` into body's conditions (with `generation`) and set `fields` (None deletes one)."""
    meta = body["metadata"]
    await update_status(
        api,
        meta["namespace"],
        meta["name"],
        lambda old: _same_conditions(old, _with_conditions(old, updates, generation, **fields)),
        known=body,
    )


def _with_conditions(
    old: dict[str, Any], updates: list[conditions.Condition], generation: int | None, **fields: Any
) -> dict[str, Any]:
    new = {**old, **{k: v for k, v in fields.items() if v is not None}}
    for key in (k for k, v in fields.items() if v is None):
        new.pop(key, None)
    new["conditions"] = conditions.merge_conditions(
        old.get("conditions"), updates, generation, conditions.now_rfc3339()
    )
    new["phase"] = conditions.phase_for(new["conditions"])
    return new


def is_news(body: Mapping[str, Any], condition: conditions.Condition) -> bool:
    """Whether a condition differs from what status already says (post an Event only then)."""
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == condition.type:
            return (c.get("reason"), c.get("message")) != (condition.reason, condition.message)
    return True


def _same_conditions(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Keep `old` when only timestamps would change (no pointless writes)."""
    strip = lambda s: {
        **s,
        "conditions": [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}  # noqa: E731
            for c in s.get("conditions") or []
        ],
    }
    return old if strip(old) == strip(new) else new
