"""spec.engine.kvOffload: the prefix cache's host tier, parsed, sized against the nodes, and given to the engine
(its --kv-offloading-size, the pod's memory, status.kvCache.offloadTokens), or refused naming the field."""

import pytest

from pagedinfer.operator.kv_plan import offload
from pagedinfer.operator.kv_plan.node_memory import Placement
from pagedinfer.operator.spec.parser import SpecError, parse_spec
from pagedinfer.operator.spec.quantity import quantity_bytes
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    LLAMA3_8B,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    running_operator,
)

GIB = 2**30


def spec(**engine):
    return parse_spec("llama", {"model": {"architecture": LLAMA3_8B}, "resources": {"gpus": 1}, "engine": engine})


@pytest.mark.parametrize(
    "text, size, fraction", [("8Gi", 8 * GIB, None), ("25%", None, 0.25), ("1.5Gi", 3 * GIB // 2, None)]
)
def test_a_size_or_a_percentage_of_the_nodes_memory(text, size, fraction):
    parsed = spec(kvOffload=text).engine.kv_offload
    assert (parsed.size_bytes, parsed.node_memory_fraction) == (size, fraction)


@pytest.mark.parametrize(
    "engine, says",
    [
        ({"kvOffload": "150%"}, "in (0%, 100%)"),
        ({"kvOffload": "lots"}, "a memory quantity"),
        ({"kvOffload": "0"}, "more than 0"),
        ({"kvOffload": "8Gi", "enablePrefixCaching": False}, "enablePrefixCaching"),
    ],
)
def test_a_bad_tier_is_a_spec_error_naming_the_field(engine, says):
    with pytest.raises(SpecError) as err:
        spec(**engine)
    assert "spec.engine.kvOffload" in str(err.value) and says in str(err.value)


def node(name, memory, gpus=8):
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": "81559"}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "memory": memory}},
    }


def test_a_percentage_is_of_the_smallest_node_and_the_fit_of_the_largest():
    nodes = [node("small", "64Gi"), node("big", "512Gi"), node("gpu-less", "2Ti", gpus=0)]
    memory = offload.node_memory(nodes, Placement(gpus=1))
    assert (memory.smallest_bytes, memory.largest_bytes, memory.largest_node) == (64 * GIB, 512 * GIB, "big")
    assert offload.tier_bytes(spec(kvOffload="25%"), memory) == 16 * GIB
    offload.check_fits(spec(kvOffload="500Gi"), 500 * GIB, 8 * GIB, memory)  # 508Gi fit the big node
    with pytest.raises(
        offload.OffloadDoesNotFit, match=r"spec.engine.kvOffload: 510Gi .* largest node it can land on \(big\)"
    ):
        offload.check_fits(spec(kvOffload="510Gi"), 510 * GIB, 8 * GIB, memory)
    with pytest.raises(offload.OffloadDoesNotFit, match="no node"):
        offload.tier_bytes(spec(kvOffload="25%"), offload.node_memory([], Placement(gpus=1)))
    assert offload.offloading_size_gib(16 * GIB) == "16" and offload.offloading_size_gib(0) is None


async def test_the_operator_gives_the_engine_its_tier_and_refuses_one_no_node_can_hold(emulator):
    await add_gpu_node(emulator, "h100", 81559)  # 1Ti allocatable memory
    async with running_operator():
        await emulator.create(
            ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}, "engine": {"kvOffload": "25%"}})
        )
        kv = await eventually(lambda: (emulator.read(ISVC, "default", "llama").get("status") or {}).get("kvCache"))
        deployment = await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama"))
        assert kv["offloadBytes"] == 256 * GIB
        assert kv["offloadTokens"] == 256 * GIB // kv["bytesPerBlock"] * kv["blockSize"] > kv["maxTokens"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        args = container["args"]
        assert args[args.index("--kv-offloading-size") + 1] == "256"
        assert quantity_bytes(container["resources"]["requests"]["memory"]) == 256 * GIB  # a GPU pod: the tier alone
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"kvOffload": "2Ti"}}})
        valid = await eventually(
            lambda: (
                condition(emulator.read(ISVC, "default", "llama"), "Valid")["status"] == "False"
                and condition(emulator.read(ISVC, "default", "llama"), "Valid")
            )
        )
    assert valid["reason"] == "InvalidSpec" and "spec.engine.kvOffload: 2Ti" in valid["message"]
    assert "largest node it can land on (h100)" in valid["message"]


def test_a_cpu_engines_memory_request_and_limit_grow_by_the_tier():
    import dataclasses

    from pagedinfer.operator.children.builders import build_pod_spec
    from pagedinfer.operator.kv_plan.planning import cpu_plan

    cpu = parse_spec("tiny", {"resources": {"gpus": 0, "memory": "3Gi"}, "engine": {"kvOffload": "1Gi"}})
    plan = dataclasses.replace(cpu_plan(cpu, None), offload_bytes=GIB)
    (container,) = build_pod_spec(cpu, plan)["containers"]
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"] == "4096Mi"
    assert container["args"][container["args"].index("--kv-offloading-size") + 1] == "1"
    assert plan.cpu_memory_budget_bytes == 2 * GIB  # the engine's budget is the pod's memory before the tier
