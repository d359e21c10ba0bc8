"""The router's children (operator/routing/builders.py) are valid Kubernetes objects, least-privilege, and tokenize
with the engines' model when the pod can mount it."""

import kubernetes_validate
import pytest

from pagedinfer.contracts.routing.warmup import DEFAULT_PREFIXES, DEFAULT_TOKEN_BUDGET
from pagedinfer.operator.children import builders
from pagedinfer.operator.children.drift import drifted_paths, patch_for
from pagedinfer.operator.kv_plan import planning
from pagedinfer.operator.routing import builders as routing
from pagedinfer.operator.routing.engine_flags import KV_EVENTS_PORT
from pagedinfer.operator.spec.parser import parse_spec

KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
OWNER = builders.Owner(name="llama", namespace="team-a", uid="uid-1", generation=1)
PLAN = planning.KVCachePlan(source="engine", block_size=16, num_gpu_blocks=None)


def spec(**router):
    return parse_spec(
        "llama",
        {
            "model": {"uri": "pvc://models/llama-3"},
            "maxReplicas": 4,
            "engine": {"apiKeySecretRef": {"name": "key"}},
            "router": router,
        },
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_router_child_passes_strict_kubernetes_validation(version):
    children = [m for _, m in routing.router_children(OWNER, spec(), "router:1")]
    for manifest in [*children, routing.build_front_service(OWNER, spec())]:
        kubernetes_validate.validate(manifest, version, strict=True)
        patch = patch_for(manifest)  # what drift repair would send, for kinds without a spec too
        assert not drifted_paths(manifest, patch)


def test_the_router_tokenizes_with_the_mounted_model_and_keeps_the_key_a_reference():
    deployment = routing.build_router_deployment(OWNER, spec(policy="least-load"), "router:1")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][container["args"].index("--tokenizer") + 1] == "/mnt/models/llama-3"
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in container["volumeMounts"]
    assert container["args"][container["args"].index("--policy") + 1] == "least-load"
    assert [e for e in container["env"] if e["name"] == "PAGEDINFER_API_KEY"][0]["valueFrom"] == {
        "secretKeyRef": {"name": "key", "key": "api-key"}
    }
    assert "livenessProbe" in container and "httpGet" not in container["livenessProbe"]  # engines down != router down
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}


def test_the_engines_publish_kv_events_only_with_the_router():
    on = builders.build_deployment(OWNER, spec(), PLAN)["spec"]["template"]["spec"]["containers"][0]
    off = builders.build_deployment(OWNER, spec(enabled=False), PLAN)["spec"]["template"]["spec"]["containers"][0]
    assert on["args"][-3:] == ["--kv-events", "--kv-events-port", str(KV_EVENTS_PORT)]
    assert {p["name"] for p in on["ports"]} == {"http", "kv-events", "kv-replay"}
    assert "--kv-events" not in off["args"] and [p["name"] for p in off["ports"]] == ["http"]


def test_the_role_grants_list_on_endpointslices_and_with_warmup_patch_on_pods_status_and_nothing_else():
    slices = {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}
    assert routing.build_role(OWNER, spec(warmup={"prefixes": 0}))["rules"] == [slices]
    assert routing.build_role(OWNER, spec())["rules"] == [
        slices,
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},  # the warmed readiness gate
    ]


def test_with_warmup_the_engine_pods_wait_on_the_warmed_gate_which_the_router_is_told_to_open():
    def pod_and_router_args(s):
        pod = builders.build_deployment(OWNER, s, PLAN)["spec"]["template"]["spec"]
        args = routing.build_router_deployment(OWNER, s, "router:1")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
        return pod.get("readinessGates"), "--warmup-readiness-gate" in args

    assert pod_and_router_args(spec()) == ([{"conditionType": "pagedinfer.io/warmed"}], True)
    assert pod_and_router_args(spec(warmup={"tokenBudget": 0})) == (None, False)  # warm-up off: no gate
    pod = builders.build_deployment(OWNER, spec(enabled=False), PLAN)["spec"]["template"]["spec"]
    assert "readinessGates" not in pod  # no router: nobody to open it


def zero_spec(**router):
    return parse_spec(
        "llama",
        {
            "minReplicas": 0,
            "maxReplicas": 4,
            "router": router,
            "autoscaling": {"enabled": True, "metrics": [{"name": "kvCacheUsage", "target": 0.5}]},
        },
    )


def test_with_scale_to_zero_the_router_may_get_and_patch_its_own_inference_service_only():
    role = routing.build_role(OWNER, zero_spec())
    assert role["rules"][2:] == [
        {
            "apiGroups": ["serving.pagedinfer.dev"],
            "resources": ["inferenceservices"],
            "verbs": ["get", "patch"],
            "resourceNames": ["llama"],
        }
    ]
    env = routing.build_router_deployment(OWNER, zero_spec(), "router:1")["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]
    assert {"name": "PAGEDINFER_INFERENCESERVICE_NAME", "value": "llama"} in env
    assert {"name": "PAGEDINFER_INFERENCESERVICE_NAMESPACE", "value": "team-a"} in env
    plain = routing.build_router_deployment(OWNER, spec(), "router:1")["spec"]["template"]["spec"]["containers"][0]
    assert not [e for e in plain["env"] if e["name"].startswith("PAGEDINFER_INFERENCESERVICE")]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(role, version, strict=True)


def test_the_queue_fields_set_become_the_routers_flags_and_only_those():
    args = lambda s: routing.build_router_deployment(OWNER, s, "router:1")["spec"]["template"]["spec"][  # noqa: E731
        "containers"
    ][0]["args"]
    both = args(zero_spec(queue={"maxRequests": 64, "timeoutSeconds": 30}))
    assert both[both.index("--max-queued-requests") + 1] == "64"
    assert both[both.index("--queue-timeout-seconds") + 1] == "30"
    one = args(spec(queue={"timeoutSeconds": 2.5}))
    assert "--max-queued-requests" not in one and one[one.index("--queue-timeout-seconds") + 1] == "2.5"


def test_the_router_image_is_the_spec_s_else_the_operator_setting(monkeypatch):
    from pagedinfer.operator.settings import OperatorConfig

    monkeypatch.setenv("PAGEDINFER_ROUTER_IMAGE", "registry.local/router:env")
    assert OperatorConfig.from_env().router_image == "registry.local/router:env"
    assert (
        OperatorConfig.from_env(router_image="registry.local/router:flag").router_image == "registry.local/router:flag"
    )
    image = lambda s: routing.build_router_deployment(OWNER, s, "default:1")["spec"]["template"]["spec"][  # noqa: E731
        "containers"
    ][0]["image"]
    assert image(spec()) == "default:1" and image(spec(image="mine:2")) == "mine:2"


def test_the_warmup_fields_reach_the_routers_own_flags():
    from pagedinfer.engine.cli import build_parser

    (container,) = routing.build_router_deployment(OWNER, spec(warmup={"prefixes": 5, "tokenBudget": 900}), "router:1")[
        "spec"
    ]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert (args.warmup_prefixes, args.warmup_token_budget) == (5, 900)
    (default,) = routing.build_router_deployment(OWNER, spec(), "router:1")["spec"]["template"]["spec"]["containers"]
    parsed = build_parser().parse_args(default["args"])
    assert (parsed.warmup_prefixes, parsed.warmup_token_budget) == (DEFAULT_PREFIXES, DEFAULT_TOKEN_BUDGET)  # passed on


def test_the_router_command_line_is_one_the_router_takes():
    from pagedinfer.engine.cli import build_parser

    container = routing.build_router_deployment(
        OWNER, zero_spec(queue={"maxRequests": 64, "timeoutSeconds": 30}), "router:1"
    )["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert (args.max_queued_requests, args.queue_timeout_seconds) == (64, 30.0)
