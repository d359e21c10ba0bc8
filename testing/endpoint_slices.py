"""The EndpointSlice controller's part for the emulated API server (there is no controller manager here).

`endpoint_slice(service, pods)` is what Kubernetes' EndpointSlice controller
writes for a Service with a selector (pkg/controller/endpointslice,
`podToEndpoint`): one endpoint per selected pod that has a podIP, with
- `serving`: the pod's Ready condition is True;
- `terminating`: the pod has a deletionTimestamp;
- `ready`: serving and not terminating (publishNotReadyAddresses: always).
So a pod being deleted shows ready=false, serving=true, terminating=true for
its whole grace period (its preStop hook runs then, and its readiness probe
still passes), and disappears when the kubelet removes the Pod object.
A named `targetPort` resolves to the pod's container port of that name.

`EndpointSliceController(emulator, namespace, service)` keeps that slice
current in the emulator: it polls every `poll_seconds` and writes only
changes (the real controller reacts to pod events within about a second).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kmock

from pagedinfer.testing.kube_emulator import KubeEmulator

PODS = kmock.resource("", "v1", "pods")
SERVICES = kmock.resource("", "v1", "services")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SLICE_API_VERSION = "discovery.k8s.io/v1"


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _selected(pod: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _target_port(port: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    for pod in pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            for p in container.get("ports") or []:
                if p.get("name") == target:
                    return int(p["containerPort"])
    return None


def endpoint_slice(service: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The EndpointSlice the controller keeps for `service` given the namespace's `pods`."""
    meta, spec = service["metadata"], service.get("spec") or {}
    selected = sorted(
        (p for p in pods if _selected(p, spec.get("selector") or {}) and (p.get("status") or {}).get("podIP")),
        key=lambda p: p["metadata"]["name"],
    )
    publish = bool(spec.get("publishNotReadyAddresses"))
    endpoints = []
    for pod in selected:
        serving = _pod_ready(pod)
        terminating = bool(pod["metadata"].get("deletionTimestamp"))
        endpoints.append(
            {
                "addresses": [pod["status"]["podIP"]],
                "conditions": {
                    "ready": publish or (serving and not terminating),
                    "serving": serving,
                    "terminating": terminating,
                },
                "targetRef": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": meta["namespace"]},
            }
        )
    ports = [
        {"name": p.get("name", ""), "port": _target_port(p, selected), "protocol": p.get("protocol", "TCP")}
        for p in spec.get("ports") or []
    ]
    return {
        "apiVersion": SLICE_API_VERSION,
        "kind": "EndpointSlice",
        "addressType": "IPv4",
        "metadata": {
            "name": f"{meta['name']}-emulated",
            "namespace": meta["namespace"],
            "labels": {SERVICE_NAME_LABEL: meta["name"]},
        },
        "ports": [p for p in ports if p["port"] is not None],
        "endpoints": endpoints,
    }


@dataclass
class EndpointSliceController:
    """Keeps `service`'s EndpointSlice in `namespace` current while `running()`."""

    emulator: KubeEmulator
    namespace: str
    service: str
    poll_seconds: float = 0.1
    writes: int = 0  # slices written (a test can wait on a change being seen)

    def __post_init__(self) -> None:
        self.slices = kmock.resource("discovery.k8s.io", "v1", "endpointslices")
        if self.slices not in self.emulator.resources:
            self.slices = self.emulator.register(SLICE_API_VERSION, "EndpointSlice", "endpointslices")

    async def sync(self) -> bool:
        """Write the slice if it changed (or remove it with its Service); True if something was written."""
        service = self.emulator.read(SERVICES, self.namespace, self.service)
        name = f"{self.service}-emulated"
        live = self.emulator.read(self.slices, self.namespace, name)
        if service is None:
            if live is not None:
                await self.emulator.remove(self.slices, self.namespace, name)
                return True
            return False
        desired = endpoint_slice(service, self.emulator.read_all(PODS, self.namespace))
        if live is None:
            await self.emulator.create(self.slices, desired)
        elif (live.get("endpoints"), live.get("ports")) != (desired["endpoints"], desired["ports"]):
            await self.emulator.merge(
                self.slices, self.namespace, name, {"endpoints": desired["endpoints"], "ports": desired["ports"]}
            )
        else:
            return False
        self.writes += 1
        return True

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[EndpointSliceController]:
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                await self.sync()
                await asyncio.sleep(self.poll_seconds)  # no wait_for: kopf, exiting, cancels tasks made after it

        task = asyncio.create_task(loop(), name=f"endpointslice controller {self.namespace}/{self.service}")
        try:
            yield self
        finally:
            stop.set()
            task.cancel()  # bounded: a write waiting on the emulator is cancelled, not awaited
            await asyncio.gather(task, return_exceptions=True)
