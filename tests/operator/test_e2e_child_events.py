"""Events of the operator's children cost a reconcile only when someone changed what the operator owns, a
reconcile that fails for good is not repeated on every status event, the rollout is reported whatever the
reconcile did, orphans are adopted or forgotten, and what the API server rewrites is not taken for an edit.

The emulator has no controllers and no garbage collector: the tests write the Deployment's status
(`roll_out`), its revision annotation and the removal of ownerReferences where those would, and say so.
"""

import pytest

from pagedinfer.operator.children.labels import OWNER_LABEL
from pagedinfer.testing.kube_emulator import Fault
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    ISVC,
    LLAMA3_8B_SPEC,
    SERVICES,
    add_gpu_node,
    condition,
    deployment_of,
    eventually,
    inference_service,
    isvc_of,
    reconciles,
    reconciles_once_handled,
    roll_out,
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

SPEC = LLAMA3_8B_SPEC


def applied(emulator):
    return condition(isvc_of(emulator), "Applied")


async def test_a_hand_edit_whose_reconcile_fails_for_good_is_still_reported_and_not_reconciled_again(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: applied(emulator)["status"] == "True")
        await roll_out(emulator, "llama", ready=1)
        await eventually(lambda: condition(isvc_of(emulator), "Ready")["status"] == "True")
        # An admission webhook now refuses every change to the Deployment; someone scales it by hand.
        emulator.faults.append(Fault(verb="patch", resource="deployments", status=403, times=None))
        await emulator.merge(DEPLOYMENTS, "default", "llama", {"spec": {"replicas": 3}})
        await eventually(lambda: applied(emulator)["reason"] == "ApplyFailed")
        ready = await eventually(
            lambda: condition(isvc_of(emulator), "Ready")["status"] == "False" and condition(isvc_of(emulator), "Ready")
        )
        assert ready["reason"] == "RolloutInProgress" and "/3 replicas" in ready["message"]  # the edited Deployment
        after_edit = reconciles(runtime)
        for ready_pods in (1, 2, 3):
            await roll_out(emulator, "llama", ready=ready_pods)
            await eventually(lambda: isvc_of(emulator)["status"]["readyReplicas"] == ready_pods)
        assert condition(isvc_of(emulator), "Ready")["status"] == "True"
        assert reconciles(runtime) == after_edit and emulator.count("patch", "deployments") == 1


async def test_a_service_refused_for_good_leaves_the_deployments_rollout_reported_without_reconciles(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    emulator.faults.append(Fault(verb="create", resource="services", status=403, times=None))
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: applied(emulator)["reason"] == "ApplyFailed")
        before = reconciles(runtime)
        for ready_pods in (0, 1):
            await roll_out(emulator, "llama", ready=ready_pods)
        await eventually(lambda: isvc_of(emulator)["status"]["readyReplicas"] == 1)
        assert condition(isvc_of(emulator), "Available")["status"] == "True"
        assert reconciles(runtime) == before and emulator.count("create", "services") == 1


async def test_metadata_other_controllers_write_on_a_child_costs_no_reconcile(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: applied(emulator)["status"] == "True")
        before = await reconciles_once_handled(emulator, runtime)
        # Playing the Deployment controller (its revision annotation) and other tools (their labels).
        await emulator.merge(
            DEPLOYMENTS,
            "default",
            "llama",
            {"metadata": {"annotations": {"deployment.kubernetes.io/revision": "2"}, "labels": {"team": "search"}}},
        )
        await emulator.merge(SERVICES, "default", "llama", {"metadata": {"annotations": {"note": "x"}}})
        await roll_out(emulator, "llama", ready=1)  # a later event: once it is reported, the others were handled
        await eventually(lambda: isvc_of(emulator)["status"]["readyReplicas"] == 1)
        assert reconciles(runtime) == before
        await emulator.merge(SERVICES, "default", "llama", {"metadata": {"labels": {OWNER_LABEL: "x"}}})
        await eventually(lambda: reconciles(runtime) > before)  # a label the operator sets is its own
        await eventually(
            lambda: emulator.read(SERVICES, "default", "llama")["metadata"]["labels"][OWNER_LABEL] == "llama"
        )


async def test_a_child_whose_owner_reference_was_removed_is_adopted_again(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: applied(emulator)["status"] == "True")
        owner_uid = isvc_of(emulator)["metadata"]["uid"]
        for resource in (DEPLOYMENTS, SERVICES):
            await emulator.merge(resource, "default", "llama", {"metadata": {"ownerReferences": None}})
        for resource in (DEPLOYMENTS, SERVICES):
            await eventually(
                lambda: (
                    [
                        r["uid"]
                        for r in emulator.read(resource, "default", "llama")["metadata"].get("ownerReferences") or []
                    ]
                    == [owner_uid]
                )
            )
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"maxNumSeqs": 64}}})
        done = await eventually(lambda: applied(emulator)["observedGeneration"] == 2 and applied(emulator))
        assert (done["status"], done["reason"]) == ("True", "ChildrenApplied")


async def test_orphans_are_forgotten_when_deleted_and_adopted_by_a_new_owner_of_their_name(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: applied(emulator)["status"] == "True")
        await reconciles_once_handled(emulator, runtime)
        service_uid = emulator.read(SERVICES, "default", "llama")["metadata"]["uid"]
        deployment_uid = deployment_of(emulator)["metadata"]["uid"]
        # `kubectl delete pisvc llama --cascade=orphan`: the garbage collector strips the ownerReferences.
        await emulator.remove(ISVC, "default", "llama")
        await eventually(lambda: isvc_of(emulator) is None)
        for resource in (DEPLOYMENTS, SERVICES):
            await emulator.merge(resource, "default", "llama", {"metadata": {"ownerReferences": None}})
        await emulator.remove(SERVICES, "default", "llama")
        await eventually(lambda: service_uid not in runtime.child_fingerprints)
        assert emulator.read(SERVICES, "default", "llama") is None  # no owner: not created again
        await emulator.create(ISVC, inference_service("llama", SPEC))
        await eventually(lambda: applied(emulator)["status"] == "True")
        adopted = deployment_of(emulator)
        assert adopted["metadata"]["uid"] == deployment_uid
        assert [r["uid"] for r in adopted["metadata"]["ownerReferences"]] == [isvc_of(emulator)["metadata"]["uid"]]


async def test_quantities_and_empty_env_values_the_api_server_rewrites_are_not_drift(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    spec = {
        **SPEC,
        "resources": {"cpu": "0.5", "memory": "1024Mi"},
        "engine": {"env": [{"name": "FEATURE_FLAGS", "value": ""}]},
    }
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", spec))
        await eventually(lambda: applied(emulator)["status"] == "True")
    container = deployment_of(emulator)["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}  # as kube-apiserver stores them
    assert {"name": "FEATURE_FLAGS"} in container["env"]
    async with running_operator() as runtime:  # the resume reconciles it again
        await eventually(lambda: reconciles(runtime) >= 1)
    assert emulator.count("patch", "deployments") == 0
