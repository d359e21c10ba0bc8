"""Events of the ConfigMaps that InferenceServices read their model config from.

A service whose `spec.model.configMapRef` ConfigMap is missing
(ModelConfigUnavailable) or holds an invalid config (ModelConfigInvalid)
is not retried in a loop: it is sized again when what it depends on
changes. Its spec changing fires kopf's update handler; the ConfigMap
changing is this module: kopf watches ConfigMaps, and an event of one that
`indexes.model_config_maps` says some service references (created, edited
or deleted) reconciles each of those services. The listing kopf does at
start (event type None) is left to the resume handler, which reconciles
every service anyway. A reconcile that fails here has already written its
status and counted its error; it is logged and waits for the next change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from pagedinfer.operator.kube_api import INFERENCESERVICES, KubeApiError
from pagedinfer.operator.reconciler import reconcile
from pagedinfer.operator.settings import Runtime


async def on_config_map_event(
    runtime: Runtime,
    config_map: Mapping[str, Any],
    event_type: str | None,
    services: list[str],
    nodes: Iterable[Mapping[str, Any]],
    logger: Any,
) -> None:
    """One watch event of a ConfigMap that `services` (in its namespace) read their model config from."""
    if event_type is None:
        return
    meta = config_map["metadata"]
    namespace = meta["namespace"]
    for name in services:
        try:
            owner = await runtime.kube.get(INFERENCESERVICES, namespace, name)
            if owner is None or owner["metadata"].get("deletionTimestamp"):
                continue
            logger.info(f"ConfigMap {meta['name']} was {event_type.lower()}; reconciling {name}.")
            await reconcile(runtime, owner, logger, nodes)
        except (kopf.TemporaryError, kopf.PermanentError, KubeApiError) as exc:
            logger.warning(f"Reconciling {name} after a change of ConfigMap {meta['name']} failed: {exc}")
