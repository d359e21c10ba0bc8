"""What status says while specs change: every condition names the generation it was set for, and an
update that cannot be applied keeps describing the Deployment that still serves.

The emulator has no Deployment controller: the tests write a Deployment's status (emulator.set_status)
where the controller would, and say so.
"""

import pytest

from pagedinfer.operator.children import builders
from pagedinfer.operator.status import conditions
from pagedinfer.testing.kube_emulator import Fault
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
    isvc_of,
    roll_out,
    running_operator,
)
from pagedinfer.testing.operator_harness import LLAMA3_8B as LLAMA3_8B_SHAPE

pytestmark = pytest.mark.timeout(120)

LLAMA3_8B = {**LLAMA3_8B_SHAPE, "hiddenSize": 4096, "maxPositionEmbeddings": 8192}


def generations(isvc):
    return {c["type"]: c.get("observedGeneration") for c in isvc["status"]["conditions"]}


async def test_every_condition_carries_the_generation_it_was_set_for(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        # Applied too: the Deployment's first event can report Available before the reconcile writes the rest.
        await eventually(
            lambda: (
                condition(isvc_of(emulator), "Available")["reason"] == "NoReplicasAvailable"
                and condition(isvc_of(emulator), "Applied")["status"] == "True"
            )
        )
        assert generations(isvc_of(emulator)) == dict.fromkeys(conditions.CONDITION_TYPES, 1)
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"maxNumSeqs": 64}}})
        await eventually(lambda: isvc_of(emulator)["status"]["observedGeneration"] == 2)
        await roll_out(emulator, "llama", ready=1)  # playing the Deployment controller: the new pod is ready
        await eventually(lambda: condition(isvc_of(emulator), "Ready")["status"] == "True")
        assert generations(isvc_of(emulator)) == dict.fromkeys(conditions.CONDITION_TYPES, 2)


async def test_an_update_that_cannot_be_applied_keeps_the_plan_the_running_deployment_serves(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        applied = await eventually(lambda: isvc_of(emulator)["status"].get("kvCache") and isvc_of(emulator))
        deployment = emulator.read(DEPLOYMENTS, "default", "llama")
        too_big = {**LLAMA3_8B, "numLayers": 80, "numParameters": 70_553_706_496, "hiddenSize": 8192}
        await emulator.merge(ISVC, "default", "llama", {"spec": {"model": {"architecture": too_big}}})
        sized = await eventually(
            lambda: condition(isvc_of(emulator), "Sized")["status"] == "False" and condition(isvc_of(emulator), "Sized")
        )
        assert sized["reason"] == "InsufficientGPUMemory" and "keeps serving the last applied spec" in sized["message"]
        assert isvc_of(emulator)["status"]["kvCache"] == applied["status"]["kvCache"]
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"blockSize": 24}}})
        valid = await eventually(
            lambda: condition(isvc_of(emulator), "Valid")["status"] == "False" and condition(isvc_of(emulator), "Valid")
        )
        assert "spec.engine.blockSize" in valid["message"] and "keeps serving" in valid["message"]
        assert isvc_of(emulator)["status"]["kvCache"] == applied["status"]["kvCache"]
        assert emulator.read(DEPLOYMENTS, "default", "llama")["spec"] == deployment["spec"]


def rollout_generations(isvc):
    return {t: g for t, g in generations(isvc).items() if t in (conditions.AVAILABLE, conditions.READY)}


async def test_available_and_ready_name_the_generation_the_deployment_serves_not_a_refused_update(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: condition(isvc_of(emulator), "Applied")["status"] == "True")
        built = emulator.read(DEPLOYMENTS, "default", "llama")
        assert builders.built_for_generation(built) == 1
        await roll_out(emulator, "llama", ready=1)
        await eventually(lambda: condition(isvc_of(emulator), "Ready")["status"] == "True")
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"blockSize": 24}}})  # invalid
        await eventually(lambda: condition(isvc_of(emulator), "Valid")["status"] == "False")
        await roll_out(emulator, "llama", ready=0)  # playing the Deployment controller: the pod restarts
        await eventually(lambda: condition(isvc_of(emulator), "Available")["status"] == "False")
        assert rollout_generations(isvc_of(emulator)) == {"Available": 1, "Ready": 1}  # not 2: never applied
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"blockSize": 16}}})  # generation 3
        await eventually(lambda: rollout_generations(isvc_of(emulator)) == {"Available": 3, "Ready": 3})
        # The same pod spec as generation 1: only the annotation changed, and nothing rolls.
        assert emulator.read(DEPLOYMENTS, "default", "llama")["spec"] == built["spec"]
        assert condition(isvc_of(emulator), "Ready")["reason"] == "ReplicasNotReady"
        await roll_out(emulator, "llama", ready=1)
        await eventually(lambda: condition(isvc_of(emulator), "Ready")["status"] == "True")


async def test_ready_is_not_claimed_for_a_generation_whose_patch_is_still_in_flight(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}}))
        await eventually(lambda: condition(isvc_of(emulator), "Applied")["status"] == "True")
        await roll_out(emulator, "llama", ready=1)
        await eventually(lambda: condition(isvc_of(emulator), "Ready")["status"] == "True")
        # A busy API server: the patch of generation 2 takes seconds, while the old pods keep reporting.
        emulator.faults.append(Fault(verb="patch", resource="deployments", status=None, delay_seconds=1.8))
        patches = emulator.received("patch", "deployments")
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"image": "ghcr.io/x/pagedinfer:v2"}}})
        await eventually(lambda: emulator.received("patch", "deployments") > patches)  # in flight, held 1.8 s
        await roll_out(emulator, "llama", ready=1, replicas=2)  # a surge pod of the old template
        await eventually(lambda: isvc_of(emulator)["status"]["replicas"] == 2)
        assert rollout_generations(isvc_of(emulator)) == {"Available": 1, "Ready": 1}
        ready = await eventually(
            lambda: (
                condition(isvc_of(emulator), "Ready").get("observedGeneration") == 2
                and condition(isvc_of(emulator), "Ready")
            )
        )
        assert (ready["status"], ready["reason"]) == ("False", "RolloutInProgress")  # the new template rolls
        await roll_out(emulator, "llama", ready=1)
        await eventually(lambda: condition(isvc_of(emulator), "Ready")["status"] == "True")
        assert rollout_generations(isvc_of(emulator)) == {"Available": 2, "Ready": 2}


async def test_a_gpu_memory_of_half_a_byte_is_an_invalid_spec_naming_the_field_not_500_megabytes(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(
            ISVC, inference_service("llama", {"model": {"architecture": LLAMA3_8B}, "resources": {"gpuMemory": "500m"}})
        )
        valid = await eventually(
            lambda: condition(isvc_of(emulator), "Valid")["status"] == "False" and condition(isvc_of(emulator), "Valid")
        )
        assert valid["reason"] == conditions.REASON_INVALID_SPEC
        assert "spec.resources.gpuMemory: '500m' is 0.5 bytes" in valid["message"]
        assert emulator.read(DEPLOYMENTS, "default", "llama") is None
