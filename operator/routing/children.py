"""Applying the router's children, and removing them when the router is turned off.

Applying goes through `children.apply_children` (the `extra` children), so the
router's children get the same clash check, adoption and drift repair as the
engine's. Turning the router off deletes each router child this
InferenceService controls (by uid precondition, in the background: the
garbage collector takes the router's ReplicaSets and pods); a child of that
name it does not control is left alone. The front Service is patched back to
the engines' selector by the same apply.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pagedinfer.operator.children.apply import owned_by
from pagedinfer.operator.kube_api import KubeApi
from pagedinfer.operator.routing.builders import router_child_names


async def remove_router_children(
    api: KubeApi, namespace: str, owner_name: str, owner_uid: str, logger: Any
) -> list[str]:
    """Delete the router's children this owner controls; returns what was deleted (`Kind/name`)."""
    deleted = []
    names = router_child_names(owner_name)
    found = await asyncio.gather(*(api.get(ref, namespace, name) for ref, name in names))
    for (ref, name), live in zip(names, found):
        if live is None or not owned_by(live, owner_uid):
            continue
        if await api.delete(ref, namespace, name, uid=live["metadata"]["uid"]):
            deleted.append(f"{live.get('kind', ref.plural)}/{name}")
    if deleted:
        logger.info(f"The router is off: deleted {', '.join(deleted)}.")
    return deleted
