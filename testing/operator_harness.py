"""Run the real pagedinfer operator (kopf.operator with the package's handlers) against a KubeEmulator.

The operator reaches the emulator only over HTTP: its login handler reads a
kubeconfig (written here, pointing at http://127.0.0.1:<random port>), exactly
as it would outside a cluster. Timeouts and retry delays are shortened through
OperatorConfig, the operator's own settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import kmock
import kopf
import yaml

from pagedinfer.contracts.inference_service import API_GROUP
from pagedinfer.operator import handlers  # noqa: F401  (registers the handlers)
from pagedinfer.operator.registry import REGISTRY
from pagedinfer.operator.settings import OperatorConfig, Runtime
from pagedinfer.testing.kube_emulator import KubeEmulator, default_emulator
from pagedinfer.testing.watched import Died, TaskWatch, raise_if_died, stop_task, watching

FAST_CONFIG = OperatorConfig(
    fetch_hf_config=False,
    api_timeout_seconds=2.0,
    retry_delay_seconds=0.3,
    no_nodes_retry_seconds=0.5,
    watch_timeout_seconds=5.0,
    error_backoffs=(0.05, 0.1, 0.2),
)
ISVC = kmock.resource("serving.pagedinfer.dev", "v1alpha1", "inferenceservices")
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SERVICES = kmock.resource("", "v1", "services")
NODES = kmock.resource("", "v1", "nodes")
CONFIGMAPS = kmock.resource("", "v1", "configmaps")
EVENTS = kmock.resource("", "v1", "events")


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "emulator",
                "clusters": [{"name": "emulator", "cluster": {"server": server}}],
                "users": [{"name": "operator", "user": {"token": "test-token"}}],
                "contexts": [
                    {"name": "emulator", "context": {"cluster": "emulator", "user": "operator", "namespace": "default"}}
                ],
            }
        )
    )
    return path


def kubeconfig_server() -> str:
    """The API server that $KUBECONFIG names (the emulator's URL, once write_kubeconfig pointed it there)."""
    config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    return config["clusters"][0]["cluster"]["server"]


@contextlib.asynccontextmanager
async def serving_emulator(**kwargs: Any) -> AsyncIterator[tuple[KubeEmulator, str]]:
    """A KubeEmulator on a random free port of 127.0.0.1; yields (emulator, base URL)."""
    emulator = default_emulator(**kwargs)
    async with emulator, kmock.Server(emulator) as server:
        yield emulator, str(server.url).rstrip("/")


@contextlib.asynccontextmanager
async def running_operator(
    config: OperatorConfig = FAST_CONFIG,
    *,
    namespaces: tuple[str, ...] = ("default",),
    startup_timeout_seconds: float = 60.0,
    stop_timeout_seconds: float = 20.0,
) -> AsyncIterator[Runtime]:
    """kopf.operator in this event loop; $KUBECONFIG must point at the emulator. Stopped as on SIGTERM.

    Inside the block the operator's task is watched (watched.py): should it end before the block does,
    every `eventually` there fails at once with its exception. startup_timeout_seconds bounds the wait for
    kopf's ready flag: generous, as kopf took over 20 s to start on a 2-core box at load 5-8 (a bound on a
    wait, not a timed assertion). The stop is bounded too (stop_task): stop_timeout_seconds after the stop
    flag, then a cancellation. The operator's exception, if it raised one, is raised at the end of a
    block that did not fail itself (one that failed has already reported it through `eventually`, or
    failed for its own reason, which stays the error)."""
    runtime = Runtime(config=config)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=REGISTRY,
            memo=kopf.Memo(pagedinfer=runtime),
            standalone=True,
            namespaces=list(namespaces),
            stop_flag=stop,
            ready_flag=ready,
        ),
        name="kopf.operator",
    )
    try:
        with watching(TaskWatch("the operator (its kopf.operator task)", task, stop.is_set)):
            await until_ready(ready, startup_timeout_seconds)
            yield runtime
    except BaseException:
        stop.set()
        await stop_task(task, stop_timeout_seconds)
        raise
    stop.set()
    await stop_task(task, stop_timeout_seconds)
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()


async def until_ready(ready: asyncio.Event, timeout_seconds: float) -> None:
    """Wait for kopf's ready flag; `Died` at once if the operator ends first (it is watched)."""
    try:
        await eventually(ready.is_set, timeout_seconds)
    except Died:
        raise
    except AssertionError as exc:
        raise TimeoutError(f"kopf.operator not ready within {timeout_seconds:g} s") from exc


async def eventually(check: Callable[[], Any], timeout_seconds: float = 20.0, interval_seconds: float = 0.05) -> Any:
    """Poll `check` until it returns a truthy value (returned) or raises nothing; fail after the timeout.

    Before each poll, what the block depends on is checked (watched.py): a process or task registered
    there (the operator's task, the kubelet harness's pods) that ended unexpectedly fails the wait at once
    with `Died`, saying which and why, instead of polling on until the timeout."""
    deadline = time.monotonic() + timeout_seconds
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        raise_if_died()
        try:
            value = check()
            if value:
                return value
            last_error = None
        except (AssertionError, KeyError, TypeError, IndexError) as exc:
            last_error = exc
        await asyncio.sleep(interval_seconds)
    if last_error is not None:
        raise AssertionError(f"not true within {timeout_seconds}s: {last_error!r}") from last_error
    raise AssertionError(f"not true within {timeout_seconds}s")


def gpu_node(
    name: str,
    memory_mib: int | None,
    *,
    product: str = "NVIDIA-H100-80GB-HBM3",
    gpus: int = 8,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A node as NVIDIA GPU Feature Discovery labels it."""
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus)}
    if memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1Ti"}},
    }


async def add_gpu_node(emulator: KubeEmulator, name: str, memory_mib: int | None, **kwargs: Any) -> None:
    """Register a node the way kubelet does: create it, then write its status (allocatable GPUs)."""
    node = gpu_node(name, memory_mib, **kwargs)
    status = node.pop("status")
    await emulator.create(NODES, node)
    await emulator.set_status(NODES, None, name, status)


# Llama-3-8B's sizing facts (spec.model.architecture), and a spec that serves it.
LLAMA3_8B = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}
LLAMA3_8B_SPEC = {"model": {"architecture": LLAMA3_8B}}


def isvc_of(emulator: KubeEmulator, name: str = "llama", namespace: str = "default") -> dict[str, Any] | None:
    return emulator.read(ISVC, namespace, name)


def deployment_of(emulator: KubeEmulator, name: str = "llama", namespace: str = "default") -> dict[str, Any] | None:
    return emulator.read(DEPLOYMENTS, namespace, name)


def inference_service(name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "serving.pagedinfer.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def roll_out(
    emulator: KubeEmulator, name: str, ready: int, *, replicas: int | None = None, namespace: str = "default"
) -> None:
    """Play the Deployment controller: it has seen the Deployment's spec, and `ready` of its pods are ready.

    replicas: the pods that exist (default the Deployment's spec.replicas), all of the current template.
    """
    deployment = emulator.read(DEPLOYMENTS, namespace, name)
    assert deployment is not None, f"no Deployment {namespace}/{name}"
    count = deployment["spec"]["replicas"] if replicas is None else replicas
    await emulator.set_status(
        DEPLOYMENTS,
        namespace,
        name,
        {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": count,
            "updatedReplicas": count,
            "readyReplicas": ready,
            "availableReplicas": ready,
        },
    )


def reconciles(runtime: Runtime) -> float:
    """How many reconciles the operator has run (pagedinfer_operator_reconciles_total, all results)."""
    return _total(runtime.metrics.reconciles)


def reconcile_errors(runtime: Runtime) -> float:
    """How many reconcile errors the operator has counted (pagedinfer_operator_errors_total, all reasons): a
    failed reconcile counts its error before it returns or raises, so before any retry of it runs."""
    return _total(runtime.metrics.errors)


def _total(counter: Any) -> float:
    return sum(s.value for s in counter.collect()[0].samples if s.name.endswith("_total"))


async def reconciles_once_handled(
    emulator: KubeEmulator, runtime: Runtime, name: str = "llama", namespace: str = "default"
) -> float:
    """The reconcile count once kopf has finished handling the creation of InferenceService `name`.

    Conditions (Applied, Sized) are written in the middle of that reconcile: it is counted after its status
    write, and kopf records the spec it handled (its last-handled-configuration annotation) after the
    handler returns. Until then a status event of the new object can still be taken for its creation and
    reconciled again, so a count read as soon as a condition shows is not yet the settled one.
    """
    annotation = f"{API_GROUP}/last-handled-configuration"
    await eventually(
        lambda: annotation in ((isvc_of(emulator, name, namespace) or {}).get("metadata", {}).get("annotations") or {})
    )
    return await eventually(lambda: reconciles(runtime) >= 1 and reconciles(runtime))


def logged(records: Iterable[logging.LogRecord], name: str, text: str) -> int:
    """How many times kopf's per-object logger (`kopf.objects`: the handlers' `logger`, kopf's own handling
    lines) said `text` about the object named `name`; `records` are caplog's, its level set to let those
    through. A wait on a line a handler logs as it ends proves that handler ran: what it did not do is done."""
    return sum(
        1
        for r in records
        if r.name == "kopf.objects" and getattr(r, "k8s_ref", {}).get("name") == name and text in r.getMessage()
    )


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    raise KeyError(type_)
