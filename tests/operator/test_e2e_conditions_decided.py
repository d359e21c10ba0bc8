"""Every reconcile decides every condition: none is left Unknown, so `kubectl wait --for=condition=X` ends.

An invalid spec cannot be sized: Sized is False with reason InvalidSpec and a message that repeats
Valid's, whether the spec is invalid on its face or only once the model's config is read. Unknown
(reason Reconciling) is only ever what a service has before its first reconcile.
"""

import json

import pytest

from pagedinfer.testing.operator_harness import (
    CONFIGMAPS,
    ISVC,
    LLAMA3_8B,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    isvc_of,
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

CONFIG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def undecided(isvc):
    return [c["type"] for c in isvc["status"]["conditions"] if c["status"] == "Unknown"]


def assert_not_sized_because_invalid(isvc, *, says):
    valid, sized = condition(isvc, "Valid"), condition(isvc, "Sized")
    assert (valid["status"], sized["status"], sized["reason"]) == ("False", "False", "InvalidSpec")
    assert "condition Valid is False (InvalidSpec)" in sized["message"] and says in sized["message"]
    assert sized["observedGeneration"] == isvc["metadata"]["generation"]
    assert undecided(isvc) == []


async def test_an_invalid_spec_is_not_sized_and_leaves_no_condition_unknown(emulator):
    await emulator.create(
        CONFIGMAPS,
        {"metadata": {"name": "two-heads", "namespace": "default"}, "data": {"config.json": json.dumps(CONFIG)}},
    )
    async with running_operator():
        await emulator.create(ISVC, inference_service("bad", {"engine": {"blockSize": 24}}))
        await emulator.create(
            ISVC,
            inference_service(
                "tp4",
                {
                    "model": {"uri": "pvc://models/llama", "configMapRef": {"name": "two-heads"}},
                    "engine": {"tensorParallelSize": 4},
                    "resources": {"gpuMemory": "80Gi"},
                },
            ),
        )
        for name, says in [("bad", "spec.engine.blockSize"), ("tp4", "does not divide the model's 2 KV heads")]:
            await eventually(lambda: condition(isvc_of(emulator, name), "Valid")["status"] == "False")
            assert_not_sized_because_invalid(isvc_of(emulator, name), says=says)
            assert isvc_of(emulator, name)["status"]["phase"] == "Invalid"


async def test_an_invalid_update_of_a_deployed_service_is_not_sized_and_says_the_deployment_keeps_serving(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "True")
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"blockSize": 24}}})
        await eventually(lambda: condition(isvc_of(emulator), "Valid")["status"] == "False")
        isvc = isvc_of(emulator)
        assert_not_sized_because_invalid(isvc, says="keeps serving the last applied spec")
        assert condition(isvc, "Applied")["status"] == "True"  # the Deployment still matches generation 1
