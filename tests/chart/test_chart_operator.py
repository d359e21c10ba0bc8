"""The operator workload: hardened pod, kopf's liveness probe, standalone or peering by replicas."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from chart_rbac import RbacPolicy
from helm_chart import NAMESPACE, helm_template


@dataclass(frozen=True)
class PeeringAccess:
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None
    subresource: str | None = None


def operator_pod(rendered):
    workloads = rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")
    assert len(workloads) == 1
    return workloads[0], workloads[0]["spec"]["template"]["spec"]


def flag(args: list[str], name: str) -> str | None:
    for arg in args:
        if arg == name:
            return ""
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def test_the_pod_runs_pagedinfer_operator_as_non_root_with_nothing_extra(helm):
    _, pod = operator_pod(helm_template(helm))
    (container,) = pod["containers"]
    assert container["command"] == ["pagedinfer", "operator"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_the_liveness_probe_asks_kopfs_health_endpoint_on_the_port_the_operator_serves(helm):
    _, pod = operator_pod(helm_template(helm, set_values={"operator.healthPort": 8181}))
    (container,) = pod["containers"]
    assert flag(container["args"], "--liveness") == "0.0.0.0:8181"  # HOST:PORT; kopf serves /healthz
    probe = container["livenessProbe"]["httpGet"]
    port = next(p for p in container["ports"] if p["name"] == probe["port"])
    assert (probe["path"], port["containerPort"]) == ("/healthz", 8181)


def test_one_replica_is_a_standalone_deployment_that_never_overlaps_its_successor(helm):
    rendered = helm_template(helm)
    workload, pod = operator_pod(rendered)
    assert workload["kind"] == "Deployment"
    assert workload["spec"]["strategy"] == {"type": "Recreate"}
    args = pod["containers"][0]["args"]
    assert flag(args, "--standalone") == "" and flag(args, "--peering") is None
    assert not rendered.kinds() & {"KopfPeering", "ClusterKopfPeering"}
    assert [c["metadata"]["name"] for c in rendered.of_kind("CustomResourceDefinition")] == [
        "inferenceservices.serving.pagedinfer.dev"
    ]


def test_replicas_above_one_peer_through_kopf_with_a_distinct_priority_per_pod(helm):
    for scope, kind, plural in (
        ("cluster", "ClusterKopfPeering", "clusterkopfpeerings"),
        ("namespace", "KopfPeering", "kopfpeerings"),
    ):
        rendered = helm_template(helm, set_values={"operator.replicas": 3, "rbac.scope": scope})
        workload, pod = operator_pod(rendered)
        assert workload["kind"] == "StatefulSet" and workload["spec"]["replicas"] == 3
        container = pod["containers"][0]
        peering = rendered.one(kind)
        assert flag(container["args"], "--peering") == peering["metadata"]["name"]
        assert flag(container["args"], "--standalone") is None
        # Each pod's ordinal (0, 1, 2) becomes its priority: never two alike.
        assert flag(container["args"], "--priority") == "$(PEERING_PRIORITY)"
        env = {e["name"]: e for e in container["env"]}
        assert (
            env["PEERING_PRIORITY"]["valueFrom"]["fieldRef"]["fieldPath"]
            == "metadata.labels['apps.kubernetes.io/pod-index']"
        )
        assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        # The peering object is a hook: its CRD must exist before Helm can map it.
        assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
        crd = next(c for c in rendered.of_kind("CustomResourceDefinition") if c["spec"]["group"] == "kopf.dev")
        assert crd["spec"]["names"]["plural"] == plural
        # kopf lists and watches the peering objects and patches its keep-alive into them.
        policy = RbacPolicy.for_service_account(rendered.documents, NAMESPACE, pod["serviceAccountName"])
        where = None if scope == "cluster" else NAMESPACE
        for verb in ("list", "watch", "patch"):
            assert policy.allows(PeeringAccess(verb, "kopf.dev", plural, where, peering["metadata"]["name"]))


def test_the_peering_crd_can_be_left_to_another_kopf_operator(helm):
    rendered = helm_template(helm, set_values={"operator.replicas": 2, "operator.peering.createCRD": False})
    assert [c["spec"]["group"] for c in rendered.of_kind("CustomResourceDefinition")] == ["serving.pagedinfer.dev"]
    assert rendered.one("ClusterKopfPeering")


def test_scope_namespace_watches_only_the_release_namespace(helm):
    _, pod = operator_pod(helm_template(helm, set_values={"rbac.scope": "namespace"}))
    args = pod["containers"][0]["args"]
    assert flag(args, "--namespace") == NAMESPACE and flag(args, "--all-namespaces") is None
    _, pod = operator_pod(helm_template(helm))
    assert flag(pod["containers"][0]["args"], "--all-namespaces") == ""


def test_the_image_is_pinned_by_digest_when_one_is_given(helm):
    digest = "sha256:" + "0f" * 32
    _, pod = operator_pod(
        helm_template(helm, set_values={"operator.image.digest": digest, "operator.image.tag": "ignored"})
    )
    assert pod["containers"][0]["image"] == f"ghcr.io/pagedinfer/pagedinfer-operator@{digest}"
    _, pod = operator_pod(helm_template(helm))
    assert pod["containers"][0]["image"] == "ghcr.io/pagedinfer/pagedinfer-operator:0.1.0"


def test_the_operator_gets_the_engine_images_for_gpu_and_cpu_services_from_the_values(helm):
    from pagedinfer.operator.settings import OperatorConfig
    from pagedinfer.operator.spec.crd_model import EngineImages

    def images(values):
        _, pod = operator_pod(helm_template(helm, set_values=values))
        parsed = parse_operator_command(pod["containers"][0])
        return OperatorConfig.from_env(
            engine_image=parsed.engine_image, engine_cpu_image=parsed.engine_cpu_image
        ).engine_images

    assert (
        images({})
        == EngineImages()
        == EngineImages("ghcr.io/pagedinfer/pagedinfer:0.1.0", "ghcr.io/pagedinfer/pagedinfer:0.1.0-cpu")
    )
    digest = "sha256:" + "0e" * 32
    assert images(
        {
            "engine.image.repository": "registry.local/engine",
            "engine.image.tag": "7",
            "engine.cpuImage.repository": "registry.local/engine",
            "engine.cpuImage.digest": digest,
            "engine.cpuImage.tag": "ignored",
        }
    ) == EngineImages("registry.local/engine:7", f"registry.local/engine@{digest}")


def parse_operator_command(container: dict):
    from pagedinfer.engine.cli import build_parser

    args = [a.replace("$(PEERING_PRIORITY)", "2") for a in container["args"]]
    return build_parser().parse_args(container["command"][1:] + args)


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"rbac.scope": "namespace", "operator.metricsPort": 9191},
        {
            "operator.huggingFace.fetchConfig": False,
            "operator.huggingFace.endpoint": "http://hub.local",
            "operator.extraArgs": ["--retry-seconds=5"],
        },
    ],
)
def test_the_operator_cli_accepts_every_flag_the_standalone_chart_passes(helm, values):
    _, pod = operator_pod(helm_template(helm, set_values=values))
    parsed = parse_operator_command(pod["containers"][0])
    assert parsed.command == "operator" and parsed.standalone is True
    assert parsed.liveness == f"0.0.0.0:{pod['containers'][0]['ports'][0]['containerPort']}"
    assert parsed.metrics_port == values.get("operator.metricsPort", 9090)


def test_the_operator_cli_accepts_the_peering_name_and_priority_the_ha_chart_passes(helm):
    rendered = helm_template(helm, set_values={"operator.replicas": 3})
    _, pod = operator_pod(rendered)
    parsed = parse_operator_command(pod["containers"][0])
    assert parsed.standalone is False
    assert parsed.peering == rendered.one("ClusterKopfPeering")["metadata"]["name"]
    assert parsed.priority == 2
