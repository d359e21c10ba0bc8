"""The pods are placed where the KV plan holds: sizing reads node affinity as the scheduler does, and a
plan sized from node labels keeps the pod off unlabelled and smaller nodes."""

import pytest

from pagedinfer.operator.kv_plan.node_memory import required_affinity_holds
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    EVENTS,
    ISVC,
    LLAMA3_8B,
    NODES,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    reconcile_errors,
    reconciles,
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

BY_NAME = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h100", "bare"]}]}


async def test_the_pod_can_only_land_on_nodes_the_plan_was_sized_for(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    await add_gpu_node(emulator, "a100-40", 40960)
    await add_gpu_node(emulator, "bare", None)  # a GPU node GPU Feature Discovery has not labelled (yet)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [BY_NAME]}}}
    async with running_operator() as runtime:
        await emulator.create(
            ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}, "affinity": affinity})
        )
        sized = await eventually(
            lambda: (
                condition(emulator.read(ISVC, "default", "llama"), "Sized")["status"] == "True"
                and condition(emulator.read(ISVC, "default", "llama"), "Sized")
            )
        )
        assert "1 of 3 nodes" in sized["message"] and "81559 MiB on node h100" in sized["message"]
        # kopf starts handlers only once the node index holds every node: the first sizing saw all three (one
        # that failed would have counted its error before the retry that sized it, and posted a Warning)
        assert reconcile_errors(runtime) == 0
        assert not [e for e in emulator.read_all(EVENTS) if e.get("reason") == "NoMatchingNodes"]
        pod = (await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama")))["spec"]["template"]["spec"]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {**BY_NAME, "matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["81558"]}]}
    ]
    landing = [
        n["metadata"]["name"]
        for n in emulator.read_all(NODES)
        if required_affinity_holds(n["metadata"]["name"], n["metadata"]["labels"], pod["affinity"])
    ]
    assert landing == ["h100"]


async def test_no_matching_nodes_says_how_to_start_on_a_node_pool_that_scales_from_zero(emulator):
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        sized = await eventually(lambda: condition(emulator.read(ISVC, "default", "llama"), "Sized"))
        assert (sized["status"], sized["reason"]) == ("False", "NoMatchingNodes")
        assert "node pool that scales from zero, set spec.resources.gpuMemory" in sized["message"]
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
        await emulator.merge(ISVC, "default", "llama", {"spec": {"resources": {"gpuMemory": "80Gi"}}})
        await eventually(
            lambda: condition(emulator.read(ISVC, "default", "llama"), "Sized")["reason"] == "SizedFromSpec"
        )
        deployment = emulator.read(DEPLOYMENTS, "default", "llama")
    assert "affinity" not in deployment["spec"]["template"]["spec"]  # the pending pod may go to any GPU node


async def test_sizing_follows_the_nodes_through_one_watch_and_never_lists_them(emulator):
    """The node index: nodes that join, are relabelled or leave are seen by sizing (here through the
    NoMatchingNodes retries), and the only node LIST is kopf's one at start, however many reconciles run."""

    def sized(name):
        return condition(emulator.read(ISVC, "default", name), "Sized")

    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("any", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: sized("any")["reason"] == "NoMatchingNodes")
        await add_gpu_node(emulator, "h100", 81559)  # joins
        await eventually(lambda: "81559 MiB on node h100" in sized("any")["message"])
        await add_gpu_node(emulator, "l40s", 46068)
        h200 = {"model": {"architecture": LLAMA3_8B}, "resources": {"gpuProduct": "NVIDIA-H200"}}
        await emulator.create(ISVC, inference_service("h200", h200))
        await eventually(lambda: "0 of 2 nodes" in sized("h200")["message"])
        await emulator.merge(NODES, None, "h100", {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}})
        await eventually(lambda: "1 of 2 nodes" in sized("h200")["message"] and sized("h200")["status"] == "True")
        await emulator.create(ISVC, inference_service("b200", {**h200, "resources": {"gpuProduct": "NVIDIA-B200"}}))
        await eventually(lambda: "0 of 2 nodes" in sized("b200")["message"])
        await emulator.remove(NODES, None, "l40s")  # leaves
        await eventually(lambda: "0 of 1 nodes" in sized("b200")["message"])
        assert reconciles(runtime) >= 6
    assert emulator.count("list", "nodes") == 1 and emulator.count("watch", "nodes") >= 1
