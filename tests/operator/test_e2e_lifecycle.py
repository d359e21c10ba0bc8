"""Spec changes roll the Deployment, HPA-style scaling flows through, and bad or oversized specs start nothing.

No controllers or garbage collector run in the emulator: the tests play them
(emulator.set_status, emulator.collect_garbage) where the cluster would.
"""

import json
import logging

import pytest

from pagedinfer.testing.operator_harness import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    ISVC,
    NODES,
    SERVICES,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    isvc_of,
    reconcile_errors,
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

LLAMA3_8B = {
    "numLayers": 32,
    "numKVHeads": 8,
    "headDim": 128,
    "numParameters": 8_030_261_248,
    "hiddenSize": 4096,
    "maxPositionEmbeddings": 8192,
}


def args_of(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def warnings(emulator, reason):
    return [e for e in emulator.read_all(EVENTS) if e.get("reason") == reason and e.get("type") == "Warning"]


async def test_a_spec_change_rolls_the_deployment_and_bumps_observed_generation(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: isvc_of(emulator)["status"]["observedGeneration"] == 1)
        first = emulator.read(DEPLOYMENTS, "default", "llama")
        await emulator.merge(
            ISVC, "default", "llama", {"spec": {"engine": {"maxNumSeqs": 64, "gpuMemoryUtilization": 0.8}}}
        )
        assert isvc_of(emulator)["metadata"]["generation"] == 2
        await eventually(lambda: isvc_of(emulator)["status"]["observedGeneration"] == 2)
        second = emulator.read(DEPLOYMENTS, "default", "llama")
        assert second["spec"]["template"] != first["spec"]["template"]
        assert second["metadata"]["generation"] == first["metadata"]["generation"] + 1
        args = args_of(second)
        assert args[args.index("--max-num-seqs") + 1] == "64"
        blocks_before = int(args_of(first)[args_of(first).index("--num-gpu-blocks-override") + 1])
        blocks_after = int(args[args.index("--num-gpu-blocks-override") + 1])
        assert blocks_after < blocks_before
        assert isvc_of(emulator)["status"]["kvCache"]["numGpuBlocks"] == blocks_after
        # The Deployment controller has not caught up: Ready says the rollout is in progress.
        await eventually(
            lambda: condition(isvc_of(emulator), "Ready")["reason"] in ("RolloutInProgress", "ReplicasNotReady")
        )


async def test_scaling_through_the_scale_subresource_reaches_the_deployment_without_a_rollout(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(
            ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}, "maxReplicas": 5})
        )
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama"))
        before = emulator.read(DEPLOYMENTS, "default", "llama")
        # What an HPA does: write spec.replicas through /scale.
        await emulator.merge(ISVC, "default", "llama", {"spec": {"replicas": 4}}, subresource="scale")
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama")["spec"]["replicas"] == 4)
        assert emulator.read(DEPLOYMENTS, "default", "llama")["spec"]["template"] == before["spec"]["template"]
        assert isvc_of(emulator)["spec"]["replicas"] == 4
        await emulator.merge(ISVC, "default", "llama", {"spec": {"replicas": 9}}, subresource="scale")
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama")["spec"]["replicas"] == 5)
        assert isvc_of(emulator)["spec"]["replicas"] == 9  # the operator never rewrites spec.replicas


async def test_an_invalid_spec_gets_valid_false_an_event_and_no_children(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("bad", {"engine": {"blockSize": 24, "maxNumSeqs": 0}}))
        valid = await eventually(lambda: condition(isvc_of(emulator, "bad"), "Valid"))
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        assert "spec.engine.blockSize" in valid["message"] and "spec.engine.maxNumSeqs" in valid["message"]
        assert isvc_of(emulator, "bad")["status"]["phase"] == "Invalid"
        await eventually(lambda: warnings(emulator, "InvalidSpec"))
        # The operator keeps running: a valid service next to it is deployed.
        await emulator.create(ISVC, inference_service("good", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "good"))
        assert emulator.read(DEPLOYMENTS, "default", "bad") is None
        assert emulator.read(SERVICES, "default", "bad") is None
        assert len(warnings(emulator, "InvalidSpec")) == 1


async def test_extra_args_abbreviating_managed_flags_are_invalid_and_the_key_is_never_echoed(emulator, caplog):
    caplog.set_level(logging.INFO)  # kopf's --debug logs whole bodies: what the user applied, key and all
    extra = ["--api-k", "sk-LITERAL", "--num-gpu-blocks=999999", "--served=other"]
    async with running_operator():
        await emulator.create(ISVC, inference_service("sneaky", {"engine": {"extraArgs": extra}}))
        valid = await eventually(lambda: condition(isvc_of(emulator, "sneaky"), "Valid"))
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        for i, flag in [(0, "'--api-k'"), (2, "'--num-gpu-blocks=...'"), (3, "'--served=...'")]:
            assert f"spec.engine.extraArgs[{i}]: {flag} abbreviates" in valid["message"], valid["message"]
        await eventually(lambda: warnings(emulator, "InvalidSpec"))
        assert emulator.read(DEPLOYMENTS, "default", "sneaky") is None
    said = json.dumps(isvc_of(emulator, "sneaky")["status"]) + json.dumps(emulator.read_all(EVENTS)) + caplog.text
    assert "sk-LITERAL" not in said and "999999" not in said


async def test_an_hf_model_that_could_never_load_is_invalid_and_says_what_to_set(emulator):
    async with running_operator():
        await emulator.create(
            ISVC,
            inference_service(
                "offline", {"model": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "architecture": LLAMA3_8B}}
            ),
        )
        valid = await eventually(lambda: condition(isvc_of(emulator, "offline"), "Valid"))
        assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
        assert "allowDownload: true" in valid["message"] and "cacheClaimName" in valid["message"]
        assert emulator.read(DEPLOYMENTS, "default", "offline") is None


async def test_a_model_too_large_for_the_gpus_is_insufficient_gpu_memory_with_numbers(emulator):
    await add_gpu_node(emulator, "l4", 23034, product="NVIDIA-L4")
    big = {**LLAMA3_8B, "numLayers": 80, "numParameters": 70_553_706_496, "hiddenSize": 8192}
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama70b", {"model": {"architecture": big}}))
        sized = await eventually(lambda: condition(isvc_of(emulator, "llama70b"), "Sized"))
        assert sized["status"] == "False" and sized["reason"] == "InsufficientGPUMemory"
        assert "GiB" in sized["message"] and "weights 131.42 GiB" in sized["message"] and "node l4" in sized["message"]
        assert "raise gpu_memory_utilization" not in sized["message"]  # the weights alone exceed the GPU
        assert "raise tensor_parallel_size to 8 (the smallest that fits)" in sized["message"]
        assert isvc_of(emulator, "llama70b")["status"]["phase"] == "Failed"
        assert condition(isvc_of(emulator, "llama70b"), "Ready")["reason"] == "NotDeployed"
        await eventually(lambda: warnings(emulator, "InsufficientGPUMemory"))
        assert emulator.read(DEPLOYMENTS, "default", "llama70b") is None
        assert emulator.count("create", "deployments") == 0


async def test_a_cpu_engine_whose_memory_cannot_hold_one_sequence_starts_nothing(emulator):
    async with running_operator():
        await emulator.create(ISVC, inference_service("tiny", {"resources": {"gpus": 0, "memory": "1030Mi"}}))
        sized = await eventually(lambda: condition(isvc_of(emulator, "tiny"), "Sized"))
        assert (sized["status"], sized["reason"]) == ("False", "InsufficientMemory")
        assert "spec.resources.memory 1030Mi" in sized["message"] and "maxModelLen=2048" in sized["message"]
        assert isvc_of(emulator, "tiny")["status"]["phase"] == "Failed"
        await eventually(lambda: warnings(emulator, "InsufficientMemory"))
        await emulator.merge(ISVC, "default", "tiny", {"spec": {"resources": {"memory": "2Gi"}}})
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "tiny"))
        # The status is written after the children are applied: the Deployment can be seen first.
        await eventually(lambda: condition(isvc_of(emulator, "tiny"), "Sized")["reason"] == "SizedFromMemory")


async def test_no_matching_nodes_is_retried_until_a_node_joins(emulator):
    await add_gpu_node(emulator, "l4", 23034, product="NVIDIA-L4")
    async with running_operator():
        await emulator.create(
            ISVC,
            inference_service(
                "llama", {"model": {"architecture": LLAMA3_8B}, "resources": {"gpuProduct": "NVIDIA-H200"}}
            ),
        )
        sized = await eventually(lambda: condition(isvc_of(emulator), "Sized"))
        assert (sized["status"], sized["reason"]) == ("False", "NoMatchingNodes")
        assert "without label nvidia.com/gpu.product=NVIDIA-H200" in sized["message"]
        assert isvc_of(emulator)["status"]["phase"] == "Pending"
        await add_gpu_node(emulator, "h200", 143771, product="NVIDIA-H200")
        sized = await eventually(
            lambda: condition(isvc_of(emulator), "Sized")["status"] == "True" and condition(isvc_of(emulator), "Sized")
        )
        assert "h200" in sized["message"]
        deployment = emulator.read(DEPLOYMENTS, "default", "llama")
        assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}


async def test_config_from_a_configmap_and_cpu_engines(emulator):
    config = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }
    await emulator.create(
        CONFIGMAPS,
        {"metadata": {"name": "llama-config", "namespace": "default"}, "data": {"config.json": json.dumps(config)}},
    )
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(
            ISVC,
            inference_service(
                "llama",
                {
                    "model": {"uri": "pvc://models/llama", "configMapRef": {"name": "llama-config"}},
                    "resources": {"gpuMemory": "80Gi"},
                },
            ),
        )
        await emulator.create(ISVC, inference_service("tiny", {"resources": {"gpus": 0}}))
        llama = await eventually(lambda: isvc_of(emulator)["status"]["kvCache"])
        assert llama["bytesPerToken"] == 128 * 1024 and llama["source"] == "spec"
        assert llama["gpuMemoryBytes"] == 80 * 2**30
        tiny = await eventually(lambda: isvc_of(emulator, "tiny")["status"]["kvCache"])
        # The embedded model's shape and the default pod memory (3Gi) less the 1 GiB runtime overhead.
        assert tiny["source"] == "memory" and tiny["cpuMemoryBudgetBytes"] == 2 * 2**30
        assert tiny["bytesPerToken"] == 2048 and tiny["numGpuBlocks"] > 50_000
        args = args_of(emulator.read(DEPLOYMENTS, "default", "tiny"))
        assert args[args.index("--num-gpu-blocks-override") + 1] == str(tiny["numGpuBlocks"])
        assert args[args.index("--cpu-memory-budget") + 1] == str(2 * 2**30)
        sized = condition(isvc_of(emulator, "tiny"), "Sized")
        assert sized["reason"] == "SizedFromMemory" and "the default pod memory 3Gi" in sized["message"]
    assert emulator.count("list", "nodes") == 1  # the node index's one listing at start; sizing lists none


async def test_a_missing_configmap_is_reported_and_picked_up_when_created(emulator):
    async with running_operator():
        await emulator.create(
            ISVC,
            inference_service(
                "llama", {"model": {"configMapRef": {"name": "later"}}, "resources": {"gpuMemory": "80Gi"}}
            ),
        )
        sized = await eventually(lambda: condition(isvc_of(emulator), "Sized"))
        assert sized["reason"] == "ModelConfigUnavailable" and "later" in sized["message"]
        config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
        await emulator.create(
            CONFIGMAPS,
            {"metadata": {"name": "later", "namespace": "default"}, "data": {"config.json": json.dumps(config)}},
        )
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")


async def test_a_deleted_deployment_is_recreated_and_deleting_the_service_cleans_up(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        first = await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama"))
        await emulator.remove(DEPLOYMENTS, "default", "llama")
        second = await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama"))
        assert second["metadata"]["uid"] != first["metadata"]["uid"]

        await emulator.remove(ISVC, "default", "llama")
        # Playing the garbage collector: children whose owner is gone are deleted.
        collected = await emulator.collect_garbage()
        assert sorted(collected) == [("Deployment", "llama"), ("Service", "llama")]
        await emulator.create(ISVC, inference_service("marker", {"resources": {"gpus": 0}}))
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "marker"))
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
        assert emulator.read(SERVICES, "default", "llama") is None
        assert emulator.read_all(NODES)  # untouched
        assert reconcile_errors(runtime) == 0
