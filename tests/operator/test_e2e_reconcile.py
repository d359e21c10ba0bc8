"""kopf for real against the emulator: apply, size from node labels, roll out, report readiness.

The emulator has no controllers: where a Deployment controller would update a
Deployment's status, the test does it (emulator.set_status) and says so.
"""

import kubernetes_validate
import pytest

from pagedinfer.operator.children.labels import selector_string
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.spec.parser import parse_spec
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    EVENTS,
    ISVC,
    SERVICES,
    add_gpu_node,
    condition,
    eventually,
    inference_service,
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
SPEC = {
    "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B", "allowDownload": True, "architecture": LLAMA3_8B},
    "replicas": 2,
}


def expected_plan(spec_dict, memory_mib):
    spec = parse_spec("llama", spec_dict)
    shape = planning.shape_from_architecture(spec.model.architecture, "auto")
    return planning.plan_for(spec, shape, memory_mib * 2**20, planning.SOURCE_NODE_LABELS)


def arg(deployment, flag):
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index(flag) + 1]


async def test_apply_sizes_from_the_smallest_matching_node_and_creates_children(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    await add_gpu_node(emulator, "a100-40", 40960)
    await add_gpu_node(emulator, "cpu-only", None, gpus=0)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", SPEC))
        isvc = await eventually(
            lambda: (
                condition(emulator.read(ISVC, "default", "llama"), "Sized")["status"] == "True"
                and emulator.read(ISVC, "default", "llama")
            )
        )
        plan = expected_plan(SPEC, 40960)
        deployment = emulator.read(DEPLOYMENTS, "default", "llama")
        service = emulator.read(SERVICES, "default", "llama")
        assert arg(deployment, "--num-gpu-blocks-override") == str(plan.num_gpu_blocks)
        assert isvc["status"]["kvCache"] == plan.to_status()
        assert isvc["status"]["kvCache"]["bytesPerBlock"] == 2 * 2**20
        assert condition(isvc, "Sized")["reason"] == "SizedFromNodeLabels"
        assert "a100-40" in condition(isvc, "Sized")["message"]
        assert isvc["status"]["observedGeneration"] == 1
        assert isvc["status"]["selector"] == selector_string("llama")
        assert isvc["status"]["url"] == "http://llama.default.svc:8000"
        for child in (deployment, service):
            assert child["metadata"]["ownerReferences"][0]["uid"] == isvc["metadata"]["uid"]
        assert deployment["spec"]["replicas"] == 2
        kubernetes_validate.validate({k: v for k, v in deployment.items() if k != "status"}, "1.30.0", strict=True)

        await eventually(
            lambda: condition(emulator.read(ISVC, "default", "llama"), "Available")["reason"] == "NoReplicasAvailable"
        )
        # Playing the Deployment controller: both pods became ready.
        await emulator.set_status(
            DEPLOYMENTS,
            "default",
            "llama",
            {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": 2,
                "updatedReplicas": 2,
                "readyReplicas": 2,
                "availableReplicas": 2,
            },
        )
        ready = await eventually(
            lambda: (
                condition(emulator.read(ISVC, "default", "llama"), "Ready")["status"] == "True"
                and emulator.read(ISVC, "default", "llama")
            )
        )
        assert ready["status"]["readyReplicas"] == 2 and ready["status"]["replicas"] == 2
        assert ready["status"]["phase"] == "Ready"
        assert condition(ready, "Available")["status"] == "True"
    assert not [e for e in emulator.read_all(EVENTS) if e["type"] == "Warning"]
