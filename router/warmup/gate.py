"""Open an engine pod's readiness gate: set its `pagedinfer.io/warmed` condition True (contracts/routing/lifecycle.py).

`PATCH /api/v1/namespaces/NS/pods/POD/status` with a strategic merge patch of
`status.conditions` (merged by `type`, so the kubelet's own conditions stay):
`{type: pagedinfer.io/warmed, status: "True", reason, message, lastTransitionTime}`.
The kubelet then marks the pod Ready (its containers being ready) and the
Deployment counts it. Least privilege: the router's Role allows `patch` on
`pods/status` in its namespace and nothing more on pods. The API server is
reached as discovery reaches it (`kube_api_args`: --kube-api, else in-cluster
with the service-account token). A failed PATCH is logged (the URL and the
error, never the token) and the caller tries again at its next health check;
a pod that is gone (404) needs nothing more.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import httpx

from pagedinfer.contracts.routing.lifecycle import WARMED_CONDITION, warmed_condition
from pagedinfer.router.discovery import DiscoverySettings, kube_api_args

logger = logging.getLogger("pagedinfer.router.warmup")

API_TIMEOUT_SECONDS = 5.0
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class ReadinessGate:
    def __init__(self, settings: DiscoverySettings) -> None:
        base, headers, verify = kube_api_args(settings.api_url, "--warmup-readiness-gate")
        self.pods_url = f"{base}/api/v1/namespaces/{settings.namespace}/pods"
        self._client = httpx.AsyncClient(headers=headers, verify=verify, timeout=API_TIMEOUT_SECONDS)
        self.num_opened = 0

    async def open(self, pod: str, reason: str, message: str) -> bool:
        """Set the pod's warmed condition True; True once done (or the pod is gone), False to try again."""
        url = f"{self.pods_url}/{pod}/status"
        patch = {"status": {"conditions": [warmed_condition(reason, message, datetime.now(UTC))]}}
        try:
            r = await self._client.patch(url, json=patch, headers={"Content-Type": STRATEGIC_MERGE_PATCH})
            if r.status_code == 404:
                return True
            r.raise_for_status()
        except httpx.HTTPError as exc:
            why = f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else type(exc).__name__
            logger.warning("cannot set %s on pod %s (PATCH %s): %s; trying again", WARMED_CONDITION, pod, url, why)
            return False
        self.num_opened += 1
        logger.info("pod %s: %s set (%s: %s)", pod, WARMED_CONDITION, reason, message)
        return True

    async def aclose(self) -> None:
        await self._client.aclose()
