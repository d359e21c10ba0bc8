"""spec.router through the real kopf runtime against the emulator: the router's children, the Service flip,
turning it off, status.routing, and an invalid router spec.

The emulator has no controllers: where a Deployment controller would report ready pods, the tests write
the status themselves (`roll_out`) and say so; its garbage collector is `collect_garbage`.
"""

import pytest

from pagedinfer.operator.children.labels import selector_labels
from pagedinfer.operator.routing import builders as routing
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
    roll_out,
    running_operator,
)

pytestmark = pytest.mark.timeout(120)

import kmock  # noqa: E402

SERVICE_ACCOUNTS = kmock.resource("", "v1", "serviceaccounts")
ROLES = kmock.resource("rbac.authorization.k8s.io", "v1", "roles")
ROLE_BINDINGS = kmock.resource("rbac.authorization.k8s.io", "v1", "rolebindings")
ROUTED = {**LLAMA3_8B_SPEC, "maxReplicas": 4, "engine": {"apiKeySecretRef": {"name": "llama-key"}}}


def router_children(emulator):
    return [
        emulator.read(DEPLOYMENTS, "default", "llama-router"),
        emulator.read(SERVICES, "default", "llama-engines"),
        emulator.read(SERVICE_ACCOUNTS, "default", "llama-router"),
        emulator.read(ROLES, "default", "llama-router"),
        emulator.read(ROLE_BINDINGS, "default", "llama-router"),
    ]


def front_selector(emulator):
    return emulator.read(SERVICES, "default", "llama")["spec"]["selector"]


def container(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]


async def test_the_router_fronts_the_engines_with_least_privilege_and_goes_away_when_turned_off(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", ROUTED))  # maxReplicas 4: on by default
        await eventually(
            lambda: condition(isvc_of(emulator), "Applied")["status"] == "True" and all(router_children(emulator))
        )
        deployment, engines, account, role, binding = router_children(emulator)
        owner_uid = isvc_of(emulator)["metadata"]["uid"]
        for child in router_children(emulator):
            assert child["metadata"]["ownerReferences"][0]["uid"] == owner_uid
        # The Service clients use (status.url) selects the router pods; the engines sit behind a headless one.
        assert front_selector(emulator) == routing.router_selector_labels("llama")
        assert isvc_of(emulator)["status"]["url"] == "http://llama.default.svc:8000"
        assert engines["spec"]["clusterIP"] == "None"
        assert engines["spec"]["selector"] == selector_labels("llama")
        # The router discovers that headless Service, with the engines' API key, non-root and read-only.
        router = container(deployment)
        assert router["args"][:8] == [
            "router",
            "--discover-service",
            "llama-engines",
            "--engine-port-name",
            "http",
            "--policy",
            "prefix",
            "--host",
        ]
        assert {
            "name": "PAGEDINFER_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "llama-key", "key": "api-key"}},
        } in router["env"]
        assert (
            router["securityContext"]["readOnlyRootFilesystem"]
            and router["readinessProbe"]["httpGet"]["path"] == "/health"
        )
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]
        assert deployment["spec"]["replicas"] == 2
        assert router["image"] == "ghcr.io/pagedinfer/pagedinfer-router:0.1.0"
        # It may list EndpointSlices in its namespace and, warm-up being on, set pods' warmed condition; no more.
        assert role["rules"] == [
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        ]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-router", "namespace": "default"}]
        assert binding["roleRef"]["name"] == "llama-router"
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
        # The engines publish their KV events.
        assert "--kv-events" in container(deployment_of(emulator))["args"]
        assert isvc_of(emulator)["status"]["routing"] == {
            "enabled": True,
            "policy": "prefix",
            "replicas": 2,
            "readyReplicas": 0,
        }
        await roll_out(emulator, "llama-router", ready=2)  # playing the Deployment controller
        await eventually(lambda: isvc_of(emulator)["status"]["routing"]["readyReplicas"] == 2)
        assert isvc_of(emulator)["status"]["replicas"] == 0  # the engines' count is not the router's

        await emulator.merge(ISVC, "default", "llama", {"spec": {"router": {"enabled": False}}})
        await eventually(lambda: not any(router_children(emulator)))
        assert front_selector(emulator) == selector_labels("llama")
        assert "--kv-events" not in container(deployment_of(emulator))["args"]
        await eventually(lambda: isvc_of(emulator)["status"]["routing"]["policy"] == "off")


async def test_a_hand_edited_role_is_put_back_and_a_deleted_router_deployment_comes_back(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {**ROUTED, "router": {"policy": "round-robin"}}))
        await eventually(lambda: all(router_children(emulator)))
        assert "round-robin" in container(router_children(emulator)[0])["args"]
        wider = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]
        await emulator.merge(ROLES, "default", "llama-router", {"rules": wider})
        await eventually(
            lambda: emulator.read(ROLES, "default", "llama-router")["rules"][0]["resources"] == ["endpointslices"]
        )
        await emulator.remove(DEPLOYMENTS, "default", "llama-router")
        await eventually(lambda: emulator.read(DEPLOYMENTS, "default", "llama-router"))


@pytest.mark.parametrize(
    "router, problem",
    [
        ({"policy": "random"}, "spec.router.policy: must be one of prefix, least-load, round-robin, got 'random'"),
        ({"replicas": 0}, "spec.router.replicas: must be an integer from 1 to 16, got 0"),
        # A limit the CRD does not name (nvidia.com/gpu) never reaches the operator: the API server prunes it
        # (test_kube_emulator_pruning.py); the parser's own refusal of it is test_router_spec.py's.
    ],
)
async def test_an_invalid_router_spec_is_valid_false_and_creates_nothing(emulator, router, problem):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", {**ROUTED, "router": router}))
        valid = await eventually(
            lambda: condition(isvc_of(emulator), "Valid")["status"] == "False" and condition(isvc_of(emulator), "Valid")
        )
    assert valid["reason"] == "InvalidSpec" and problem in valid["message"]
    assert not any(router_children(emulator)) and deployment_of(emulator) is None


async def test_one_replica_gets_no_router_unless_asked(emulator):
    await add_gpu_node(emulator, "h100", 81559)
    async with running_operator():
        await emulator.create(ISVC, inference_service("llama", LLAMA3_8B_SPEC))
        await eventually(lambda: condition(isvc_of(emulator), "Applied")["status"] == "True")
        assert not any(router_children(emulator))
        assert front_selector(emulator) == selector_labels("llama")
        assert isvc_of(emulator)["status"]["routing"]["policy"] == "off"
        await emulator.merge(ISVC, "default", "llama", {"spec": {"router": {"enabled": True}}})
        await eventually(lambda: all(router_children(emulator)))
        assert front_selector(emulator) == routing.router_selector_labels("llama")
