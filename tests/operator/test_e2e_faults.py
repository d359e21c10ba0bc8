"""Injected API errors and slow answers, and an operator restarted midway, still converge with no duplicates."""

import pytest

from pagedinfer.testing.kube_emulator import Fault
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    SERVICES,
    add_gpu_node,
    eventually,
    inference_service,
    running_operator,
)

pytestmark = pytest.mark.timeout(150)

LLAMA3_8B = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248}


def created(emulator, resource):
    return sum(
        1 for access, code in emulator.calls if access.verb == "create" and access.resource == resource and code == 201
    )


def converged(emulator, names):
    for name in names:
        isvc = emulator.read(ISVC, "default", name)
        sized = [c for c in (isvc.get("status") or {}).get("conditions") or [] if c["type"] == "Sized"]
        if not sized or sized[0]["status"] != "True" or isvc["status"].get("observedGeneration") != 1:
            return False
        if emulator.read(DEPLOYMENTS, "default", name) is None or emulator.read(SERVICES, "default", name) is None:
            return False
    return True


async def test_conflicts_server_errors_and_slow_answers_converge(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    emulator.faults += [
        Fault(verb="create", resource="deployments", status=500, times=3),
        Fault(verb="create", resource="services", status=409, times=1),
        Fault(verb="list", resource="nodes", status=None, delay_seconds=3.0, times=1),  # > the 2 s API timeout
        Fault(verb="patch", resource="inferenceservices", subresource="status", status=409, times=2),
        Fault(verb="patch", resource="inferenceservices", subresource=None, status=500, times=2),  # kopf's own
        Fault(verb="get", resource="deployments", status=503, times=1),
    ]
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: converged(emulator, ["llama"]), timeout_seconds=60)
        assert not emulator.faults  # every fault was hit
        assert len(emulator.read_all(DEPLOYMENTS)) == 1 and len(emulator.read_all(SERVICES)) == 1
        assert created(emulator, "deployments") == 1
        assert runtime.metrics.errors.collect()[0].samples  # the retries were counted
        status = emulator.read(ISVC, "default", "llama")["status"]
        assert status["kvCache"]["numGpuBlocks"] > 0 and status["phase"] == "Deploying"


async def test_forbidden_requests_are_retried_until_rbac_allows_them(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    denied = {"allow": False}
    emulator.authorizer = lambda access: denied["allow"] or access.resource != "nodes"
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: any(code == 403 for _, code in emulator.calls))
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
        denied["allow"] = True
        await eventually(lambda: converged(emulator, ["llama"]), timeout_seconds=30)


async def test_an_operator_restarted_midway_converges_without_duplicate_children(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    names = [f"svc-{i}" for i in range(6)]
    emulator.faults.append(Fault(verb="create", resource="services", status=500, times=None))
    async with running_operator():
        for name in names:
            await emulator.create(ISVC, inference_service(name, {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: emulator.read_all(DEPLOYMENTS), timeout_seconds=30)
    # Stopped midway: Deployments exist, Service creation keeps failing, no status written yet.
    assert not converged(emulator, names) and emulator.read_all(SERVICES) == []
    emulator.faults.clear()
    async with running_operator():
        await eventually(lambda: converged(emulator, names), timeout_seconds=60)
    assert len(emulator.read_all(DEPLOYMENTS)) == len(names) == created(emulator, "deployments")
    assert len(emulator.read_all(SERVICES)) == len(names) == created(emulator, "services")
    patched = [a for a, code in emulator.calls if a.verb == "patch" and a.resource == "deployments"]
    assert patched == []  # the resumed operator found its children up to date and left them alone
