"""Every rendering of the chart (defaults and each optional feature) is valid Kubernetes.

Kubernetes' own kinds pass `kubernetes-validate --strict` for 1.28 (the
chart's kubeVersion floor), 1.30 and the newest schema the library ships.
prometheus-operator's kinds are not in its schemas: they are checked
structurally against the minimal schemas in
tests/support/prometheus_operator_schemas.py. Custom resources of our own and
kopf's CRDs are checked against the openAPIV3Schema of the CRD rendered with
them, and an InferenceService also against the operator's own spec parser.
"""

from __future__ import annotations

import re

import jsonschema
import kubernetes_validate
import pytest
from helm_chart import MONITORING_API, NAMESPACE, REPO, helm_template
from prometheus_operator_schemas import SCHEMAS

# 1.28 is the floor Chart.yaml declares (kubeVersion >=1.28.0-0).
KUBE_VERSIONS = ("1.28.0", "1.30.0", kubernetes_validate.utils.latest_version())
CRD_SOURCE = REPO / "crds" / "inferenceservices.yaml"

# name -> (values, needs the monitoring API)
SCENARIOS: dict[str, tuple[dict, bool]] = {
    "defaults": ({}, False),
    "namespace-scope": ({"rbac.scope": "namespace"}, False),
    "ha-cluster": ({"operator.replicas": 3}, False),
    "ha-namespace": ({"operator.replicas": 2, "rbac.scope": "namespace"}, False),
    "engine-podmonitor": ({"monitoring.engine.podMonitor.enabled": True}, True),
    "operator-servicemonitor": ({"monitoring.operator.serviceMonitor.enabled": True}, True),
    "prometheusrule": ({"monitoring.prometheusRule.enabled": True}, True),
    "grafana-dashboard": ({"monitoring.grafanaDashboard.enabled": True}, False),
    "example-inferenceservice": ({"exampleInferenceService.enabled": True}, False),
    "everything": (
        {
            "operator.replicas": 2,
            "rbac.scope": "namespace",
            "monitoring.engine.podMonitor.enabled": True,
            "monitoring.operator.serviceMonitor.enabled": True,
            "monitoring.prometheusRule.enabled": True,
            "monitoring.grafanaDashboard.enabled": True,
            "exampleInferenceService.enabled": True,
            "operator.image.digest": "sha256:" + "ab" * 32,
            "operator.extraArgs": ["--retry-seconds=5"],
        },
        True,
    ),
}


def render(helm: str, scenario: str):
    values, monitoring = SCENARIOS[scenario]
    return helm_template(helm, set_values=values, api_versions=(MONITORING_API,) if monitoring else ())


def custom_resource_schemas(documents) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema of every CRD rendered (crds/ included)."""
    out = {}
    for crd in (d for d in documents if d["kind"] == "CustomResourceDefinition"):
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            out[key] = version["schema"]["openAPIV3Schema"]
    return out


def validate(document: dict, crd_schemas: dict) -> None:
    api, kind = document["apiVersion"], document["kind"]
    if api == MONITORING_API:
        jsonschema.validate(document, SCHEMAS[kind])
    elif (api, kind) in crd_schemas:
        # OpenAPI v3.0 schemas use draft-4 keywords (boolean exclusiveMinimum).
        jsonschema.Draft4Validator(crd_schemas[(api, kind)]).validate(document)
    else:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_is_valid(helm, scenario):
    rendered = render(helm, scenario)
    schemas = custom_resource_schemas(rendered.documents)
    assert rendered.documents
    for document in rendered.documents:
        try:
            validate(document, schemas)
        except Exception as exc:  # name the object that failed
            raise AssertionError(f"{scenario}: {document['kind']}/{document['metadata']['name']}: {exc}") from exc


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_namespaced_objects_land_in_the_release_namespace(helm, scenario):
    cluster_kinds = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ClusterKopfPeering"}
    for document in render(helm, scenario).documents:
        if document["kind"] not in cluster_kinds:
            assert document["metadata"]["namespace"] == NAMESPACE, document["kind"]


def test_each_optional_feature_adds_its_objects_and_is_off_by_default(helm):
    default = render(helm, "defaults").kinds()
    assert default == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
    }
    assert "PodMonitor" in render(helm, "engine-podmonitor").kinds()
    assert "ServiceMonitor" in render(helm, "operator-servicemonitor").kinds()
    assert "PrometheusRule" in render(helm, "prometheusrule").kinds()
    assert "ConfigMap" in render(helm, "grafana-dashboard").kinds()
    assert "InferenceService" in render(helm, "example-inferenceservice").kinds()


def test_names_stay_dns_labels_for_a_long_release_name(helm):
    longest_release_name = "a-release-name-that-is-as-long-as-helm-allows-53-char"
    assert len(longest_release_name) == 53
    rendered = helm_template(
        helm,
        set_values={"operator.replicas": 2, "monitoring.grafanaDashboard.enabled": True},
        release=longest_release_name,
    )
    label = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    for document in rendered.documents:
        name = document["metadata"]["name"]
        if document["kind"] != "CustomResourceDefinition":
            assert len(name) <= 63 and label.match(name), (document["kind"], name)


def test_the_example_inferenceservice_is_accepted_by_the_operator(helm):
    from pagedinfer.operator.spec.parser import parse_spec

    for gpus in (0, 1):
        example = helm_template(
            helm, set_values={"exampleInferenceService.enabled": True, "exampleInferenceService.gpus": gpus}
        ).one("InferenceService")
        spec = parse_spec(example["metadata"]["name"], example["spec"])
        assert spec.resources.gpus == gpus
        assert spec.model.uri is None  # the embedded model: no download


def test_the_chart_crd_is_a_byte_identical_copy_of_crds():
    chart_copy = REPO / "charts" / "pagedinfer" / "crds" / "inferenceservices.yaml"
    assert chart_copy.read_bytes() == CRD_SOURCE.read_bytes(), (
        "charts/pagedinfer/crds/inferenceservices.yaml differs from crds/inferenceservices.yaml: "
        "copy crds/inferenceservices.yaml into the chart"
    )


def test_the_chart_ships_no_other_crd_file():
    files = sorted(p.name for p in (REPO / "charts" / "pagedinfer" / "crds").iterdir())
    assert files == [CRD_SOURCE.name]
