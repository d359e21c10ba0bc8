"""The pods are placed where the KV plan holds: sizing reads node affinity as the scheduler does, and a
plan sized from node labels keeps the pod off unlabelled and smaller nodes."""

import pytest

from operator_harness import DEPLOYMENTS, ISVC, LLAMA3_8B, NODES, add_gpu_node, condition, eventually, \
    inference_service, running_operator
from pagedinfer.operator.node_memory import required_affinity_holds

pytestmark = pytest.mark.timeout(120)

BY_NAME = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h100", "bare"]}]}


async def test_the_pod_can_only_land_on_nodes_the_plan_was_sized_for(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    await add_gpu_node(emulator, "a100-40", 40960)
    await add_gpu_node(emulator, "bare", None)  # a GPU node GPU Feature Discovery has not labelled (yet)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [BY_NAME]}}}
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B},
                                                                "affinity": affinity}))
        sized = await eventually(lambda: condition(emulator.read(ISVC, "default", "llama"), "Sized")["status"]
                                 == "True" and condition(emulator.read(ISVC, "default", "llama"), "Sized"))
        assert "1 of 3 nodes" in sized["message"] and "81559 MiB on node h100" in sized["message"]
        pod = (await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama")))["spec"]["template"]["spec"]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {**BY_NAME, "matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["81558"]}]}]
    landing = [n["metadata"]["name"] for n in emulator.read_all(NODES)
               if required_affinity_holds(n["metadata"]["name"], n["metadata"]["labels"], pod["affinity"])]
    assert landing == ["h100"]


async def test_no_matching_nodes_says_how_to_start_on_a_node_pool_that_scales_from_zero(emulator):
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        sized = await eventually(lambda: condition(emulator.read(ISVC, "default", "llama"), "Sized"))
        assert (sized["status"], sized["reason"]) == ("False", "NoMatchingNodes")
        assert "node pool that scales from zero, set spec.resources.gpuMemory" in sized["message"]
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
        await emulator.merge(ISVC, "default", "llama", {"spec": {"resources": {"gpuMemory": "80GiB"}}})
        await eventually(lambda: condition(emulator.read(ISVC, "default", "llama"), "Sized")["reason"]
                         == "SizedFromSpec")
        deployment = emulator.read(DEPLOYMENTS, "default", "llama")
    assert "affinity" not in deployment["spec"]["template"]["spec"]  # the pending pod may go to any GPU node
