"""The demand signal: with requests held and no engine to wake, PATCH `DEMAND_ANNOTATION` on our InferenceService.

The operator scales the InferenceService 0 -> 1 when the annotation changes
(a watch event: no metrics scrape in the way). Least privilege: the router's
Role allows `get` and `patch` on its own InferenceService only (by
`resourceNames`). It talks to the API server as discovery does
(`discovery.kube_api_args`: --kube-api, else in-cluster with the
service-account token), with a JSON merge patch of the annotation alone.

At most one PATCH per `DEMAND_MIN_INTERVAL_SECONDS` (the caller asks while
requests wait). A failure is logged once (the URL and the error, never the
token) until a PATCH succeeds again, and kept in `problem`, which the held
requests' 503 then names.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from pagedinfer.contracts.routing.demand import (
    DEMAND_ANNOTATION,
    DEMAND_MIN_INTERVAL_SECONDS,
    INFERENCESERVICE_NAME_ENV,
    INFERENCESERVICE_NAMESPACE_ENV,
)
from pagedinfer.router.discovery import kube_api_args

logger = logging.getLogger("pagedinfer.router.demand")

API_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class DemandTarget:
    """The InferenceService whose annotation the router writes."""

    name: str
    namespace: str
    api_url: str | None = None  # None: in-cluster

    @classmethod
    def from_env(cls, api_url: str | None = None) -> DemandTarget | None:
        """From the operator's env vars; None when the name is unset (no signal: a router outside the operator)."""
        name = os.environ.get(INFERENCESERVICE_NAME_ENV) or None
        namespace = os.environ.get(INFERENCESERVICE_NAMESPACE_ENV) or None
        if name is None:
            return None
        if namespace is None:
            raise ValueError(f"{INFERENCESERVICE_NAMESPACE_ENV}: must be set with {INFERENCESERVICE_NAME_ENV}")
        return cls(name, namespace, api_url)

    def path(self) -> str:
        from pagedinfer.contracts.inference_service import API_GROUP, API_VERSION, PLURAL

        return f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.name}"


def rfc3339_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class DemandSignal:
    def __init__(self, target: DemandTarget, clock: Callable[[], float] = time.monotonic) -> None:
        base, headers, verify = kube_api_args(target.api_url, INFERENCESERVICE_NAME_ENV)
        self.target = target
        self.url = base + target.path()
        self.clock = clock
        self._client = httpx.AsyncClient(headers=headers, verify=verify, timeout=API_TIMEOUT_SECONDS)
        self._last_attempt: float | None = None
        self.problem: str | None = None  # why the last PATCH failed; None after a success
        self.num_signals = 0  # PATCHes that succeeded

    def due(self) -> bool:
        return self._last_attempt is None or self.clock() - self._last_attempt >= DEMAND_MIN_INTERVAL_SECONDS

    async def signal(self) -> bool:
        """PATCH the annotation with the time now; False (and `problem` set) if the API server refused or was
        unreachable."""
        self._last_attempt = self.clock()
        patch = {"metadata": {"annotations": {DEMAND_ANNOTATION: rfc3339_utc(datetime.now(UTC))}}}
        try:
            r = await self._client.patch(self.url, json=patch, headers={"Content-Type": "application/merge-patch+json"})
            r.raise_for_status()
        except httpx.HTTPError as exc:
            why = f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else type(exc).__name__
            if self.problem is None:
                logger.warning(
                    "cannot signal demand on InferenceService %s/%s (PATCH %s): %s",
                    self.target.namespace,
                    self.target.name,
                    self.url,
                    why,
                )
            self.problem = f"the router cannot reach the Kubernetes API to ask for an engine ({why})"
            return False
        if self.problem is not None:
            logger.info("demand signalled on InferenceService %s/%s again", self.target.namespace, self.target.name)
        self.problem = None
        self.num_signals += 1
        return True

    async def aclose(self) -> None:
        await self._client.aclose()
