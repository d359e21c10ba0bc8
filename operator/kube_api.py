"""A small async Kubernetes REST client for the operator's own calls (children, ConfigMaps, status).

kopf talks to the API server through its own client; this one is for what
the handlers do. It is built from the same `kopf.ConnectionInfo` that the
operator's login handler returns (service account in a pod, kubeconfig
elsewhere), so both always reach the same server with the same identity.

Errors: every non-2xx answer raises `KubeApiError(status, reason, message)`;
timeouts and connection failures raise `KubeApiError(status=None)`. The
reconciler turns them into kopf.TemporaryError (retried with backoff),
except a write of a child the API server refuses for good (`retryable`
False), which is reported in status and not retried; an exceeded
ResourceQuota (`quota_exceeded`) is reported and retried after a longer wait.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"  # merges a pod's status.conditions by type


class KubeApiError(Exception):
    """A Kubernetes API request that failed: its HTTP status (None: no response), reason and message."""

    def __init__(self, status: int | None, reason: str, message: str) -> None:
        super().__init__(f"{status or 'no response'} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    @property
    def retryable(self) -> bool:
        """Whether the same request can succeed later with nothing changed.

        Conflicts, throttling, timeouts, server errors and network trouble
        pass with time; so do 401 (the login is renewed) and 404 (the object
        went away between a read and a write; the next attempt reads again).
        Any other 4xx (400, 403, 422: the manifest, RBAC or an admission
        webhook refused it) comes back the same until someone changes it.
        """
        return self.status is None or self.status in (401, 404, 408, 409, 429) or self.status >= 500

    @property
    def quota_exceeded(self) -> bool:
        """A 403 from a ResourceQuota that is full (`... is forbidden: exceeded quota: NAME, requested: ...`).

        Not retryable as such, but it passes without any change to the request
        once something in the namespace is deleted or the quota is raised.
        """
        return self.status == 403 and "exceeded quota" in self.message.lower()


@dataclass(frozen=True)
class ResourceRef:
    """Where a kind lives in the REST API."""

    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name:
            parts.append(quote(name, safe=""))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


CONFIGMAPS = ResourceRef("v1", "configmaps")
SERVICES = ResourceRef("v1", "services")
PODS = ResourceRef("v1", "pods")
DEPLOYMENTS = ResourceRef("apps/v1", "deployments")
SERVICE_ACCOUNTS = ResourceRef("v1", "serviceaccounts")
ROLES = ResourceRef("rbac.authorization.k8s.io/v1", "roles")
ROLE_BINDINGS = ResourceRef("rbac.authorization.k8s.io/v1", "rolebindings")
INFERENCESERVICES = ResourceRef("serving.pagedinfer.dev/v1alpha1", "inferenceservices")


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    """TLS as the kubeconfig or service account says; plain http (tests, proxies) gets none."""
    if not info.server.startswith("https"):
        return False
    context = ssl.create_default_context(cafile=os.fspath(info.ca_path) if info.ca_path else None)
    if info.ca_data:
        context.load_verify_locations(cadata=_pem(info.ca_data))
    if info.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if info.certificate_path or info.certificate_data:
        with tempfile.TemporaryDirectory() as tmp:
            cert = _to_file(tmp, "cert.pem", info.certificate_path, info.certificate_data)
            key = _to_file(tmp, "key.pem", info.private_key_path, info.private_key_data)
            context.load_cert_chain(cert, key)
    return context


def _pem(data: str | bytes) -> str:
    """kubeconfig *-data fields are base64 of PEM; accept PEM too."""
    text = data.decode() if isinstance(data, bytes) else data
    return text if "-----BEGIN" in text else base64.b64decode(text).decode()


def _to_file(tmp: str, name: str, path: Any, data: str | bytes | None) -> str | None:
    if path:
        return os.fspath(path)
    if data is None:
        return None
    full = os.path.join(tmp, name)
    with open(full, "w", encoding="utf-8") as f:
        f.write(_pem(data))
    return full


class KubeApi:
    """One aiohttp session per connection; `calls` counts requests (for metrics and the benchmark)."""

    def __init__(self, info: kopf.ConnectionInfo, *, timeout_seconds: float = 30.0) -> None:
        self._info = info
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        self.calls = 0

    @property
    def server(self) -> str:
        return self._info.server.rstrip("/")

    async def _ensure(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=_ssl_context(self._info), limit=32)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                headers=self._info.as_http_headers(),
                trust_env=self._info.trust_env,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        session = await self._ensure()
        self.calls += 1
        headers = {"Content-Type": content_type} if body is not None else {}
        try:
            async with session.request(
                method, self.server + path, json=body, params=params, headers=headers
            ) as response:
                payload = await response.json(content_type=None) if response.content_length != 0 else {}
                if response.status >= 400:
                    payload = payload if isinstance(payload, dict) else {}
                    raise KubeApiError(
                        response.status, payload.get("reason", response.reason or ""), payload.get("message", "")
                    )
                return payload if isinstance(payload, dict) else {}
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise KubeApiError(None, type(exc).__name__, f"{method} {path}: {exc!r}") from exc

    async def get(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", ref.path(namespace, name))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(
        self, ref: ResourceRef, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        return list((await self.request("GET", ref.path(namespace), params=params)).get("items") or [])

    async def create(self, ref: ResourceRef, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", ref.path(namespace), body=body)

    async def patch(
        self,
        ref: ResourceRef,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        """A JSON merge patch (lists replaced whole); `STRATEGIC_MERGE_PATCH` for a built-in kind's merge keys."""
        return await self.request("PATCH", ref.path(namespace, name, subresource), body=body, content_type=content_type)

    async def delete(self, ref: ResourceRef, namespace: str | None, name: str, uid: str | None = None) -> bool:
        """Delete in the background (the garbage collector takes dependants); False when already gone.

        uid: delete only that object (a precondition: a 409 if the name now holds another)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", ref.path(namespace, name), body=body)
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True
