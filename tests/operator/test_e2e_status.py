"""What status says while specs change: every condition names the generation it was set for, and an
update that cannot be applied keeps describing the Deployment that still serves.

The emulator has no Deployment controller: the tests write a Deployment's status (emulator.set_status)
where the controller would, and say so.
"""

import pytest

from operator_harness import DEPLOYMENTS, ISVC, add_gpu_node, condition, eventually, inference_service, running_operator
from pagedinfer.operator import status

pytestmark = pytest.mark.timeout(120)

LLAMA3_8B = {"numLayers": 32, "numKVHeads": 8, "headDim": 128, "numParameters": 8_030_261_248,
             "hiddenSize": 4096, "maxPositionEmbeddings": 8192}


def isvc_of(emulator, name="llama"):
    return emulator.read(ISVC, "default", name)


def generations(isvc):
    return {c["type"]: c.get("observedGeneration") for c in isvc["status"]["conditions"]}


async def test_every_condition_carries_the_generation_it_was_set_for(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: condition(isvc_of(emulator), "Available")["reason"] == "NoReplicasAvailable")
        assert generations(isvc_of(emulator)) == dict.fromkeys(status.CONDITION_TYPES, 1)
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"maxNumSeqs": 64}}})
        await eventually(lambda: isvc_of(emulator)["status"]["observedGeneration"] == 2)
        # Playing the Deployment controller: the rolled-out pod became ready.
        deployment = emulator.read(DEPLOYMENTS, "default", "llama")
        await emulator.set_status(DEPLOYMENTS, "default", "llama", {
            "observedGeneration": deployment["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
            "readyReplicas": 1, "availableReplicas": 1})
        await eventually(lambda: condition(isvc_of(emulator), "Ready")["status"] == "True")
        assert generations(isvc_of(emulator)) == dict.fromkeys(status.CONDITION_TYPES, 2)


async def test_an_update_that_cannot_be_applied_keeps_the_plan_the_running_deployment_serves(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        applied = (await eventually(lambda: isvc_of(emulator)["status"].get("kvCache") and isvc_of(emulator)))
        deployment = emulator.read(DEPLOYMENTS, "default", "llama")
        too_big = {**LLAMA3_8B, "numLayers": 80, "numParameters": 70_553_706_496, "hiddenSize": 8192}
        await emulator.merge(ISVC, "default", "llama", {"spec": {"model": {"architecture": too_big}}})
        sized = await eventually(lambda: condition(isvc_of(emulator), "Sized")["status"] == "False"
                                 and condition(isvc_of(emulator), "Sized"))
        assert sized["reason"] == "InsufficientGPUMemory" and "keeps serving the last applied spec" in sized["message"]
        assert isvc_of(emulator)["status"]["kvCache"] == applied["status"]["kvCache"]
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"blockSize": 24}}})
        valid = await eventually(lambda: condition(isvc_of(emulator), "Valid")["status"] == "False"
                                 and condition(isvc_of(emulator), "Valid"))
        assert "spec.engine.blockSize" in valid["message"] and "keeps serving" in valid["message"]
        assert isvc_of(emulator)["status"]["kvCache"] == applied["status"]["kvCache"]
        assert emulator.read(DEPLOYMENTS, "default", "llama")["spec"] == deployment["spec"]
