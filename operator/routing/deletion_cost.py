"""Cache-preserving scale-in: mark each engine pod with the cache it serves, so the coldest goes first.

Before the autoscaler lowers `spec.replicas`, every ready engine pod gets the
annotation `controller.kubernetes.io/pod-deletion-cost` = the prefix-cache hit
tokens it served over the last scrape interval (the delta of
`pagedinfer_prefix_cache_hits_total` the autoscaler already reads,
autoscaling.readings.PodReading). The ReplicaSet controller deletes pods of
lower cost first (after unscheduled, pending and not-ready ones), so the
replica whose cache serves the fewest hits is the one removed, and the
prefixes the router keeps sending to the others stay warm. A pod whose
reading failed or has no previous scrape yet counts 0: nothing says it is warm.

Costs are clamped to the annotation's int32 range. A pod is patched only
when its cost changed; a failed patch is logged and does not stop the scale-in
(the order then falls back to the controller's own).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pagedinfer.operator.autoscaling.readings import PodReading
from pagedinfer.operator.kube_api import PODS, KubeApi, KubeApiError

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
INT32_MAX = 2**31 - 1
logger = logging.getLogger("pagedinfer.operator.routing")


def deletion_costs(readings: Mapping[str, PodReading | None]) -> dict[str, int]:
    """Pod name -> its deletion cost: hit tokens over the last interval (0 when unknown)."""
    costs = {}
    for name, reading in readings.items():
        hits = reading.prefix_cache_hit_tokens if reading is not None else None
        costs[name] = min(INT32_MAX, max(0, round(hits))) if hits is not None else 0
    return costs


async def annotate_deletion_costs(
    kube: KubeApi, namespace: str, pods: Sequence[Mapping[str, Any]], costs: Mapping[str, int]
) -> int:
    """Patch each pod whose annotation differs from its cost; returns how many were patched."""
    patched = 0
    for pod in pods:
        meta = pod["metadata"]
        cost = str(costs.get(meta["name"], 0))
        if (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) == cost:
            continue
        try:
            await kube.patch(
                PODS, namespace, meta["name"], {"metadata": {"annotations": {DELETION_COST_ANNOTATION: cost}}}
            )
            patched += 1
        except KubeApiError as e:
            logger.warning("cannot mark pod %s/%s with its deletion cost: %s", namespace, meta["name"], e)
    return patched
