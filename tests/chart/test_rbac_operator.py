"""The real operator, run with the chart's command line, needs exactly the chart's RBAC rules.

The chart is rendered; the rules its Roles/ClusterRoles grant the operator's
ServiceAccount become the emulated API server's authorizer (anything else is
answered 403, as RBAC would). Then `pagedinfer operator` is started as a
process with the container's own arguments (only the liveness and metrics
ports are moved to free ports on 127.0.0.1) and drives every path it has:
sizing from node labels, a model read from a ConfigMap, an unsized model that
raises a Warning Event, a Deployment becoming ready, a spec change and a
hand-edited Service patched back, the autoscaler scaling up to
minReplicas through the scale subresource, and, with no router pod ready,
the operator opening a warmed-up engine pod's readiness gate itself.

- With the chart's rules: everything reconciles and no request is refused.
- Every rule the chart grants is used at least once (nothing is granted that
  the operator does not call).
- With one verb taken away, the operator's request is refused with 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import kmock
import pytest
from chart_rbac import RbacPolicy
from fake_engine_metrics import fake_engines
from helm_chart import NAMESPACE, helm_template

from pagedinfer.contracts.routing.lifecycle import WARMED_CONDITION
from pagedinfer.testing.kubelet_harness import PODS, add_ready_pod, pod_from_template, pod_is_ready, pod_manifest
from pagedinfer.testing.operator_harness import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    ISVC,
    SERVICES,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    roll_out,
    serving_emulator,
    write_kubeconfig,
)
from pagedinfer.testing.server_process import free_port

SPEC_HASH = "serving.pagedinfer.dev/spec-hash"
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

PAGEDINFER = Path(sys.executable).parent / "pagedinfer"
TENANT = "team-a"  # where InferenceServices live when the operator is cluster-wide
LLAMA3_8B = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}
LLAMA3_8B_CONFIG = (
    '{"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, '
    '"num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336, '
    '"vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}'
)
LLAMA3_405B = {"numLayers": 126, "numKVHeads": 8, "headDim": 128, "numParameters": 405_000_000_000}


def chart(helm: str, scope: str):
    rendered = helm_template(helm, set_values={"rbac.scope": scope})
    workload = rendered.one("Deployment")
    pod = workload["spec"]["template"]["spec"]
    policy = RbacPolicy.for_service_account(rendered.documents, NAMESPACE, pod["serviceAccountName"])
    return pod["containers"][0], policy


def local_args(container: dict, liveness_port: int, metrics_port: int) -> list[str]:
    """The container's command line, with its two listening ports moved to free local ones."""
    args = []
    for arg in container["args"]:
        if arg.startswith("--liveness="):
            arg = f"--liveness=127.0.0.1:{liveness_port}"
        elif arg.startswith("--metrics-port="):
            arg = f"--metrics-port={metrics_port}"
        args.append(arg)
    assert container["command"] == ["pagedinfer", "operator"]
    return [str(PAGEDINFER), "operator", *args]


@contextlib.asynccontextmanager
async def operator_process(argv: list[str], kubeconfig: Path, log: Path, pod_id: str = "pi-pagedinfer-operator-0"):
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["KUBECONFIG"] = str(kubeconfig)
    env["POD_ID"] = pod_id  # as the chart sets it from metadata.name: kopf's identity
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(log.parent)
        )
        try:
            yield process
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 20)
                except TimeoutError:
                    process.kill()
                    await process.wait()


ROUTER_KINDS = (
    DEPLOYMENTS,
    kmock.resource("", "v1", "serviceaccounts"),
    kmock.resource("rbac.authorization.k8s.io", "v1", "roles"),
    kmock.resource("rbac.authorization.k8s.io", "v1", "rolebindings"),
)
# Held only to be granted to the routers (RBAC escalation prevention): the operator never calls it.
GRANTED_NOT_CALLED = {"list endpointslices.discovery.k8s.io"}
LONG_AGO = "2020-01-01T00:00:00Z"  # a pod's containers ready since then: past any warm-up gate timeout


async def seed(emulator, namespace: str, engine_ip: str) -> None:
    """Nodes as GPU Feature Discovery labels them, a model config in a ConfigMap, four InferenceServices."""
    await add_gpu_node(emulator, "gpu-a", 81559)
    await add_gpu_node(emulator, "gpu-b", 81559)
    await emulator.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "llama3-8b-config", "namespace": namespace},
            "data": {"config.json": LLAMA3_8B_CONFIG},
        },
    )
    gpu = {"gpus": 1}
    hf = {"uri": "hf://meta-llama/Meta-Llama-3-8B", "allowDownload": True}
    for name, spec in (
        ("inline", {"model": {**hf, "architecture": LLAMA3_8B}, "resources": gpu}),
        ("from-configmap", {"model": {**hf, "configMapRef": {"name": "llama3-8b-config"}}, "resources": gpu}),
        (
            "too-big",
            {
                "model": {**hf, "uri": "hf://meta-llama/Meta-Llama-3.1-405B", "architecture": LLAMA3_405B},
                "resources": gpu,
            },
        ),
        (
            "autoscaled",
            {
                "model": {**hf, "architecture": LLAMA3_8B},
                "resources": gpu,
                "replicas": 1,
                "minReplicas": 2,
                "maxReplicas": 3,
                "autoscaling": {
                    "enabled": True,
                    "intervalSeconds": 1,
                    "metrics": [{"name": "kvCacheUsage", "target": 0.8}],
                },
            },
        ),
        (
            "scaled-in",
            {
                "model": {**hf, "architecture": LLAMA3_8B},
                "resources": gpu,
                "replicas": 2,
                "minReplicas": 1,
                "maxReplicas": 2,
                "autoscaling": {
                    "enabled": True,
                    "intervalSeconds": 0.5,
                    "metrics": [{"name": "kvCacheUsage", "target": 0.8}],
                    "scaleDown": {"stabilizationWindowSeconds": 0},
                },
            },
        ),
        ("gated", {"model": {**hf, "architecture": LLAMA3_8B}, "resources": gpu, "maxReplicas": 2}),  # warm-up
    ):
        await emulator.create(ISVC, inference_service(name, spec, namespace))
    await add_ready_pod(emulator, namespace, pod_manifest("scaled-in-0", "scaled-in", engine_ip))


def sized(emulator, namespace: str, name: str) -> bool:
    return condition(emulator.read(ISVC, namespace, name), "Sized")["status"] == "True"


async def run_until_reconciled(emulator, namespace: str, process) -> None:
    await eventually(
        lambda: (
            running(process) and sized(emulator, namespace, "inline") and sized(emulator, namespace, "from-configmap")
        ),
        timeout_seconds=60,
    )
    await eventually(lambda: condition(emulator.read(ISVC, namespace, "too-big"), "Sized")["status"] == "False")
    await eventually(
        lambda: [e for e in emulator.read_all(EVENTS, namespace) if e.get("reason") == "InsufficientGPUMemory"]
    )
    # Playing the Deployment controller: the "inline" engine's pod became ready.
    deployment = emulator.read(DEPLOYMENTS, namespace, "inline")
    await emulator.set_status(
        DEPLOYMENTS,
        namespace,
        "inline",
        {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
        },
    )
    await eventually(
        lambda: condition(emulator.read(ISVC, namespace, "inline"), "Ready")["status"] == "True", timeout_seconds=30
    )
    # Someone edits the Service by hand, then the spec changes: the operator patches both children back.
    await emulator.merge(SERVICES, namespace, "inline", {"metadata": {"annotations": {SPEC_HASH: "edited"}}})
    await emulator.merge(ISVC, namespace, "inline", {"spec": {"engine": {"maxNumSeqs": 128}}})
    await eventually(
        lambda: (
            "128"
            in emulator.read(DEPLOYMENTS, namespace, "inline")["spec"]["template"]["spec"]["containers"][0]["args"]
            and emulator.read(SERVICES, namespace, "inline")["metadata"]["annotations"][SPEC_HASH] != "edited"
        ),
        timeout_seconds=30,
    )
    # The autoscaler lists the pods and lifts spec.replicas to minReplicas through the scale subresource.
    await eventually(
        lambda: (
            emulator.read(ISVC, namespace, "autoscaled")["spec"]["replicas"] == 2
            and (emulator.read(ISVC, namespace, "autoscaled").get("status") or {}).get("autoscaling")
        ),
        timeout_seconds=60,
    )
    assert [e for e in emulator.read_all(EVENTS, namespace) if e.get("reason") == "ScaledUp"]
    # "autoscaled" (maxReplicas 3) has a router: its RBAC children, hand-edited, are patched back; then the
    # router is turned off and its children deleted.
    await eventually(
        lambda: all(emulator.read(ref, namespace, "autoscaled-router") for ref in ROUTER_KINDS), timeout_seconds=30
    )
    for ref in ROUTER_KINDS[1:]:
        await emulator.merge(ref, namespace, "autoscaled-router", {"metadata": {"annotations": {SPEC_HASH: "edited"}}})
    await eventually(
        lambda: all(
            emulator.read(ref, namespace, "autoscaled-router")["metadata"]["annotations"][SPEC_HASH] != "edited"
            for ref in ROUTER_KINDS[1:]
        ),
        timeout_seconds=30,
    )
    await emulator.merge(ISVC, namespace, "autoscaled", {"spec": {"router": {"enabled": False}}})
    await eventually(
        lambda: not any(emulator.read(ref, namespace, "autoscaled-router") for ref in ROUTER_KINDS), timeout_seconds=30
    )
    # "gated": its router never ready, an engine pod whose containers are ready and whose warm-up gate stayed
    # closed past the timeout: the operator opens the gate (pods/status), and the pod turns Ready.
    deployment = await eventually(lambda: emulator.read(DEPLOYMENTS, namespace, "gated"), timeout_seconds=30)
    gated = pod_from_template("gated-0", deployment["spec"]["template"], "127.0.0.254")
    assert gated["spec"]["readinessGates"] == [{"conditionType": WARMED_CONDITION}]
    for c in gated["status"]["conditions"]:
        c["lastTransitionTime"] = LONG_AGO
    await add_ready_pod(emulator, namespace, gated)
    await roll_out(emulator, "gated", ready=0, replicas=1, namespace=namespace)  # the Deployment controller
    await eventually(lambda: pod_is_ready(emulator.read(PODS, namespace, "gated-0")), timeout_seconds=30)
    # "scaled-in": one idle engine too many; the autoscaler marks the pods' deletion cost, then scales in.
    await eventually(lambda: emulator.read(ISVC, namespace, "scaled-in")["spec"]["replicas"] == 1, timeout_seconds=60)


async def release_watches(emulator, namespace: str) -> None:
    """Give each kind the operator watched one last event, after the operator is gone.

    The emulator's watch streams notice a departed client only when they next
    write; without an event they stay open and the HTTP server's shutdown
    waits out aiohttp's 60 s grace period.
    """
    labels = {"app.kubernetes.io/managed-by": "pagedinfer-operator"}
    await emulator.create(
        DEPLOYMENTS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "teardown", "namespace": namespace, "labels": labels},
            "spec": {},
        },
    )
    for ref in ROUTER_KINDS[1:]:
        await emulator.create(ref, {"metadata": {"name": "teardown", "namespace": namespace, "labels": labels}})
    await emulator.merge(ISVC, namespace, "inline", {"metadata": {"annotations": {"teardown": "true"}}})


class OperatorExited(RuntimeError):
    """The operator process ended while the test waited for it (not retried by `eventually`)."""


def running(*processes) -> bool:
    for process in processes:
        if process.returncode is not None:
            raise OperatorExited(f"pagedinfer operator exited with {process.returncode}")
    return True


def rbac_resource(access) -> str:
    return f"{access.resource}/{access.subresource}" if access.subresource else access.resource


def refused(emulator) -> list:
    return [access for access, code in emulator.calls if code == 403]


def unused_rules(policy: RbacPolicy, emulator) -> list[str]:
    allowed = [access for access, code in emulator.calls if code != 403]
    unused = []
    for rule in policy.rules:
        for verb in sorted(rule.verbs):
            for resource in sorted(rule.resources):
                res, _, sub = resource.partition("/")
                if not any(
                    a.verb == verb
                    and a.group in rule.api_groups
                    and a.resource == res
                    and (a.subresource or "") == sub
                    and rule.matches(a)
                    for a in allowed
                ):
                    unused.append(f"{verb} {resource}.{next(iter(rule.api_groups)) or 'core'}")
    return [rule for rule in unused if rule not in GRANTED_NOT_CALLED]


@pytest.mark.parametrize(("scope", "namespace"), [("cluster", TENANT), ("namespace", NAMESPACE)])
async def test_the_operator_works_within_the_charts_rbac_and_uses_all_of_it(helm, tmp_path, scope, namespace):
    container, policy = chart(helm, scope)
    liveness, metrics = free_port(), free_port()
    async with fake_engines(1) as engines, serving_emulator(authorizer=policy.allows) as (emulator, url):
        await seed(emulator, namespace, engines[0].ip)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        async with operator_process(
            local_args(container, liveness, metrics), kubeconfig, tmp_path / "operator.log"
        ) as process:
            await run_until_reconciled(emulator, namespace, process)
            async with aiohttp.ClientSession() as session:  # the chart's liveness probe path answers
                async with session.get(f"http://127.0.0.1:{liveness}/healthz") as response:
                    assert response.status == 200
                async with session.get(f"http://127.0.0.1:{metrics}/metrics") as response:
                    assert "pagedinfer_operator_reconciles_total" in await response.text()
        await release_watches(emulator, namespace)
        log = (tmp_path / "operator.log").read_text()
        assert emulator.read(SERVICES, namespace, "inline") and emulator.read(SERVICES, namespace, "from-configmap")
        assert not refused(emulator), f"requests outside the chart's RBAC: {refused(emulator)}\n{log[-3000:]}"
        assert not unused_rules(policy, emulator), f"granted but never used: {unused_rules(policy, emulator)}"


@pytest.mark.parametrize(
    ("group", "resource", "verb"),
    [
        ("apps", "deployments", "create"),
        ("", "configmaps", "get"),
        ("serving.pagedinfer.dev", "inferenceservices/scale", "patch"),
    ],
)
async def test_taking_one_verb_away_gets_the_operator_a_403(helm, tmp_path, group, resource, verb):
    container, policy = chart(helm, "cluster")
    reduced = policy.without_verb(group, resource, verb)
    async with fake_engines(1) as engines, serving_emulator(authorizer=reduced.allows) as (emulator, url):
        await seed(emulator, TENANT, engines[0].ip)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        async with operator_process(
            local_args(container, free_port(), free_port()), kubeconfig, tmp_path / "operator.log"
        ) as process:
            denied = await eventually(
                lambda: (
                    running(process)
                    and [a for a in refused(emulator) if (a.group, rbac_resource(a), a.verb) == (group, resource, verb)]
                ),
                timeout_seconds=60,
            )
        await release_watches(emulator, TENANT)
    assert denied[0].namespace == TENANT
    assert {(a.group, rbac_resource(a), a.verb) for a in refused(emulator)} == {(group, resource, verb)}


async def test_two_peered_operators_work_within_the_charts_ha_rbac(helm, tmp_path):
    rendered = helm_template(helm, set_values={"operator.replicas": 2})
    pod = rendered.one("StatefulSet")["spec"]["template"]["spec"]
    policy = RbacPolicy.for_service_account(rendered.documents, NAMESPACE, pod["serviceAccountName"])
    peering = rendered.one("ClusterKopfPeering")
    async with serving_emulator(authorizer=policy.allows) as (emulator, url):
        peerings = emulator.register("kopf.dev/v1", "ClusterKopfPeering", "clusterkopfpeerings", namespaced=False)
        await emulator.create(
            peerings,
            {k: v for k, v in peering.items() if k != "metadata"} | {"metadata": {"name": peering["metadata"]["name"]}},
        )
        await seed(emulator, TENANT, "127.0.0.254")  # nothing scraped: the engine's address answers nothing
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        async with contextlib.AsyncExitStack() as stack:
            processes = []
            for index in (0, 1):  # what the kubelet expands $(PEERING_PRIORITY) to in pod <sts>-<index>
                argv = [
                    a.replace("$(PEERING_PRIORITY)", str(index))
                    for a in local_args(pod["containers"][0], free_port(), free_port())
                ]
                processes.append(
                    await stack.enter_async_context(
                        operator_process(
                            argv,
                            kubeconfig,
                            tmp_path / f"operator-{index}.log",
                            pod_id=f"pi-pagedinfer-operator-{index}",
                        )
                    )
                )
            await eventually(lambda: running(*processes) and sized(emulator, TENANT, "inline"), timeout_seconds=60)
            status = await eventually(
                lambda: (
                    (emulator.read(peerings, None, peering["metadata"]["name"]).get("status") or {})
                    if len(emulator.read(peerings, None, peering["metadata"]["name"]).get("status") or {}) == 2
                    else None
                )
            )
            assert {p["priority"] for p in status.values()} == {0, 1}
        await release_watches(emulator, TENANT)
    assert not refused(emulator), f"requests outside the chart's RBAC: {refused(emulator)}"
