"""The Deployment and Service stay as the spec says: hand edits are patched back (also across a restart),
a deleted Service comes back, a name clash and a refused manifest show in status instead of looping.

The emulator has no controllers: nothing defaults fields or scales pods; the tests write what they need.
"""

import copy

import pytest

from pagedinfer.operator.children.drift import drifted_paths
from pagedinfer.operator.children.labels import selector_labels
from pagedinfer.testing.kube_emulator import Fault
from pagedinfer.testing.operator_harness import (
    DEPLOYMENTS,
    EVENTS,
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
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

SPEC = LLAMA3_8B_SPEC


def engine(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]


async def hand_edit(emulator, image="evil:latest", replicas=5):
    """What `kubectl edit deployment llama` does: a new image for the engine, another replica count."""
    containers = deployment_of(emulator)["spec"]["template"]["spec"]["containers"]
    containers[0]["image"] = image
    await emulator.merge(
        DEPLOYMENTS,
        "default",
        "llama",
        {"spec": {"replicas": replicas, "template": {"spec": {"containers": containers}}}},
    )


async def test_hand_edits_to_the_deployment_are_patched_back_and_defaults_are_left_alone(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        built = await eventually(
            lambda: condition(isvc_of(emulator), "Applied")["status"] == "True" and deployment_of(emulator)
        )
        built_template = copy.deepcopy(built["spec"]["template"])
        # Playing the API server's defaulting: fields the operator never sets are not drift.
        containers = built["spec"]["template"]["spec"]["containers"]
        containers[0] |= {"imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"}
        before = reconciles(runtime)
        await emulator.merge(
            DEPLOYMENTS,
            "default",
            "llama",
            {"spec": {"template": {"spec": {"containers": containers, "dnsPolicy": "ClusterFirst"}}}},
        )
        await eventually(lambda: reconciles(runtime) > before)
        assert emulator.count("patch", "deployments") == 0

        await hand_edit(emulator)
        repaired = await eventually(
            lambda: engine(deployment_of(emulator))["image"] != "evil:latest" and deployment_of(emulator)
        )
        assert repaired["spec"]["replicas"] == 1
        assert engine(repaired)["image"] == engine(built)["image"]
        assert drifted_paths(repaired["spec"]["template"], built_template) == []  # the pod it built


async def test_hand_edits_made_while_the_operator_was_away_are_patched_back_on_restart(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", SPEC))
        built = await eventually(
            lambda: condition(isvc_of(emulator), "Applied")["status"] == "True" and deployment_of(emulator)
        )
    await hand_edit(emulator)
    async with running_operator():
        repaired = await eventually(
            lambda: engine(deployment_of(emulator))["image"] != "evil:latest" and deployment_of(emulator)
        )
    assert repaired["spec"]["replicas"] == 1 and engine(repaired)["image"] == engine(built)["image"]


async def test_with_autoscaling_the_deployments_replicas_are_not_fought_over_but_its_image_is(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    autoscaled = {
        **SPEC,
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 4,
        "autoscaling": {"enabled": True, "intervalSeconds": 3600, "metrics": [{"name": "kvCacheUsage", "target": 0.8}]},
    }
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", autoscaled))
        await eventually(lambda: condition(isvc_of(emulator), "Applied")["status"] == "True")
        before = reconciles(runtime)
        await emulator.merge(DEPLOYMENTS, "default", "llama", {"spec": {"replicas": 3}})
        await eventually(lambda: reconciles(runtime) > before)
        assert deployment_of(emulator)["spec"]["replicas"] == 3
        await hand_edit(emulator, replicas=3)
        repaired = await eventually(
            lambda: engine(deployment_of(emulator))["image"] != "evil:latest" and deployment_of(emulator)
        )
        assert repaired["spec"]["replicas"] == isvc_of(emulator)["spec"]["replicas"] == 2  # the owner's count


async def test_a_deleted_or_edited_service_is_put_back_while_the_operator_runs(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", SPEC))
        first = await eventually(lambda: emulator.read(SERVICES, "default", "llama"))
        await emulator.remove(SERVICES, "default", "llama")
        second = await eventually(lambda: emulator.read(SERVICES, "default", "llama"))
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        await emulator.merge(SERVICES, "default", "llama", {"spec": {"selector": {"app": "elsewhere"}}})
        await eventually(
            lambda: emulator.read(SERVICES, "default", "llama")["spec"]["selector"] == selector_labels("llama")
        )


async def test_a_name_clash_with_an_unowned_service_is_a_child_conflict_and_creates_nothing(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    await emulator.create(
        SERVICES,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "llama", "namespace": "default"},
            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]},
        },
    )
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", SPEC))
        applied = await eventually(lambda: condition(isvc_of(emulator), "Applied"))
        assert (applied["status"], applied["reason"]) == ("False", "ChildConflict")
        assert "Service default/llama already exists and is not controlled by this" in applied["message"]
        assert isvc_of(emulator)["status"]["phase"] == "Failed"
        assert condition(isvc_of(emulator), "Ready")["reason"] == "NotDeployed"
        assert emulator.count("create", "deployments") == 0  # no half-applied pair
        # the Event is posted beside the status patch, not before it: wait for it, as a watcher would
        await eventually(lambda: [e for e in emulator.read_all(EVENTS) if e.get("reason") == "ChildConflict"])
        await emulator.remove(SERVICES, "default", "llama")
        await eventually(lambda: condition(isvc_of(emulator), "Applied")["status"] == "True")
        assert deployment_of(emulator) and emulator.read(SERVICES, "default", "llama")["spec"][
            "selector"
        ] == selector_labels("llama")


async def test_a_manifest_the_api_server_refuses_is_apply_failed_and_not_retried_until_the_spec_changes(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    emulator.faults.append(Fault(verb="create", resource="deployments", status=422, times=1))
    async with running_operator() as runtime:
        await emulator.create(ISVC, inference_service("llama", SPEC))
        applied = await eventually(
            lambda: (
                condition(isvc_of(emulator), "Applied")["reason"] == "ApplyFailed"
                and condition(isvc_of(emulator), "Applied")
            )
        )
        assert applied["status"] == "False" and applied["observedGeneration"] == 1
        assert "refused Deployment default/llama: 422" in applied["message"]
        assert "injected fault: 422 for create deployments" in applied["message"]  # the API server's message
        assert isvc_of(emulator)["status"]["phase"] == "Failed"
        # a permanent error: kopf records the spec as handled (last-handled-configuration), no retry pending
        await reconciles_once_handled(emulator, runtime)
        assert emulator.count("create", "deployments") == 1
        await emulator.merge(ISVC, "default", "llama", {"spec": {"engine": {"maxNumSeqs": 64}}})
        await eventually(lambda: condition(isvc_of(emulator), "Applied")["status"] == "True")
        assert deployment_of(emulator) is not None


async def test_an_exceeded_resource_quota_is_quota_exceeded_and_retried_until_the_quota_has_room(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    refusal = (
        'deployments.apps "llama" is forbidden: exceeded quota: team-a, requested: count/deployments.apps=1, '
        "used: count/deployments.apps=4, limited: count/deployments.apps=4"
    )
    emulator.faults.append(Fault(verb="create", resource="deployments", status=403, times=3, message=refusal))
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", SPEC))
        applied = await eventually(
            lambda: (
                condition(isvc_of(emulator), "Applied")["reason"] == "QuotaExceeded"
                and condition(isvc_of(emulator), "Applied")
            )
        )
        assert applied["status"] == "False" and "A ResourceQuota refused Deployment default/llama" in applied["message"]
        assert "exceeded quota: team-a" in applied["message"] and "Retried every 0.5 s" in applied["message"]
        assert isvc_of(emulator)["status"]["phase"] == "Pending"
        await eventually(lambda: condition(isvc_of(emulator), "Applied")["status"] == "True")
        assert emulator.count("create", "deployments") == 4 and deployment_of(emulator) is not None
        assert len([e for e in emulator.read_all(EVENTS) if e.get("reason") == "QuotaExceeded"]) == 1
