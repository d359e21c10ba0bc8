"""Engine discovery in a cluster: the ready endpoints of the engines' Service, from its EndpointSlices.

The router lists `discovery.k8s.io/v1` EndpointSlices labelled
`kubernetes.io/service-name=<service>` in its own namespace every
`poll_interval_seconds` (`--discovery-poll-interval-seconds`, default
`lifecycle.DISCOVERY_POLL_INTERVAL_SECONDS`, which also sizes the engines'
preStop wait; namespace-scoped `list` on endpointslices is all
the RBAC it needs) and hands the set of engine URLs to the state owner:
- an endpoint counts when `conditions.ready` is true (absent means ready, as
  the API documents) and it is not `terminating`: a terminating pod (the
  EndpointSlice controller writes ready=false, serving=true, terminating=true
  from its deletionTimestamp on) is removed at the next poll and gets no new
  requests, while the requests already proxied to it finish;
- a new ready pod is added at the next poll, then health-checked (0.5 s), so
  it gets traffic within about 2 s;
- a failed list keeps the last known set (an API-server hiccup never empties
  the router);
- with `readiness_gate` (`--warmup-readiness-gate`), the endpoints that are
  not ready and not terminating are also handed on, with their pod's name
  (`targetRef`): pods that may wait on the warm-up readiness gate
  (contracts/routing/lifecycle.py), which the router warms and then marks.

Talks to the API server with httpx and the pod's service-account token; no
kubernetes client library (the router image stays small).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pagedinfer.contracts import validators
from pagedinfer.contracts.routing.lifecycle import DISCOVERY_POLL_INTERVAL_SECONDS

logger = logging.getLogger("pagedinfer.router.discovery")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class DiscoverySettings:
    service: str  # the engines' (headless) Service
    namespace: str
    port_name: str = "http"  # the EndpointSlice port that serves HTTP
    api_url: str | None = None  # None: in-cluster (KUBERNETES_SERVICE_HOST, the service-account token)
    poll_interval_seconds: float = DISCOVERY_POLL_INTERVAL_SECONDS
    readiness_gate: bool = False  # also follow not-ready pods, to warm them and set their warmed condition

    def __post_init__(self) -> None:
        validators.positive_seconds("poll_interval_seconds", self.poll_interval_seconds)


def in_cluster_namespace() -> str | None:
    path = SERVICE_ACCOUNT_DIR / "namespace"
    return path.read_text().strip() if path.is_file() else None


@dataclass(frozen=True)
class Endpoints:
    """What one list of the EndpointSlices says: the engines to route to, and those still becoming ready."""

    ready: list[str]  # URLs of the ready, not terminating endpoints, sorted
    pending: dict[str, str]  # URL -> pod name of the not ready, not terminating ones that name their pod


def engine_endpoints(slices: Iterable[dict[str, Any]], port_name: str = "http") -> Endpoints:
    """The ready and the pending (not ready, not terminating, with a Pod targetRef) endpoints, one address each."""
    ready, pending = set(), {}
    for s in slices:
        ports = s.get("ports") or []
        port = next((p.get("port") for p in ports if p.get("name") == port_name), None)
        if port is None and len(ports) == 1:
            port = ports[0].get("port")
        if port is None:
            continue
        for endpoint in s.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            addresses = endpoint.get("addresses") or []
            if conditions.get("terminating") is True or not addresses:
                continue
            host = addresses[0]
            url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            if conditions.get("ready") is not False:
                ready.add(url)
            elif (endpoint.get("targetRef") or {}).get("kind") == "Pod" and endpoint["targetRef"].get("name"):
                pending[url] = endpoint["targetRef"]["name"]
    return Endpoints(sorted(ready), {u: pod for u, pod in sorted(pending.items()) if u not in ready})


def ready_engine_urls(slices: Iterable[dict[str, Any]], port_name: str = "http") -> list[str]:
    """Engine URLs of the ready, not terminating endpoints (one address each), sorted."""
    return engine_endpoints(slices, port_name).ready


def _client_args(settings: DiscoverySettings) -> tuple[str, dict[str, str], Any]:
    return kube_api_args(settings.api_url, "--discover-service")


def kube_api_args(api_url: str | None, needed_by: str) -> tuple[str, dict[str, str], Any]:
    """(API base URL, headers, TLS verify) for the API server: `api_url` as given (--kube-api), else in-cluster
    with the pod's service-account token; ValueError naming `needed_by` outside a cluster."""
    if api_url is not None:
        return api_url.rstrip("/"), {}, True
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ValueError(f"{needed_by}: not in a cluster (no KUBERNETES_SERVICE_HOST); pass --kube-api")
    token = (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}", {"Authorization": f"Bearer {token}"}, str(SERVICE_ACCOUNT_DIR / "ca.crt")


async def follow_endpoint_slices(
    settings: DiscoverySettings, on_change: Callable[[list[str], dict[str, str]], None]
) -> None:
    """Poll the Service's EndpointSlices until cancelled; on_change(ready urls, pending {url: pod}) whenever
    they change (pending stays empty without `settings.readiness_gate`)."""
    base, headers, verify = _client_args(settings)
    url = f"{base}/apis/discovery.k8s.io/v1/namespaces/{settings.namespace}/endpointslices"
    params = {"labelSelector": f"{SERVICE_NAME_LABEL}={settings.service}"}
    last: Endpoints | None = None
    async with httpx.AsyncClient(headers=headers, verify=verify, timeout=10.0) as client:
        while True:
            try:
                r = await client.get(url, params=params)
                r.raise_for_status()
                found = engine_endpoints(r.json().get("items") or [], settings.port_name)
            except (httpx.HTTPError, ValueError) as exc:
                logger.warning("cannot list the EndpointSlices of %s/%s: %s", settings.namespace, settings.service, exc)
            else:
                if not settings.readiness_gate:
                    found = Endpoints(found.ready, {})
                if found != last:
                    on_change(found.ready, found.pending)
                    last = found
            await asyncio.sleep(settings.poll_interval_seconds)
