"""values.yaml is documented and schema-checked; impossible combinations fail the install clearly."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import pytest
import yaml
from helm_chart import CHART, MONITORING_API, REPO, RenderError, helm_template

VALUES = CHART / "values.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def schema_node(path: tuple[str, ...]) -> dict | None:
    node = SCHEMA
    for key in path:
        props = node.get("properties") or {}
        if key not in props:
            return None
        node = props[key]
    return node


def is_section(node: dict | None) -> bool:
    """A closed object of named values (operator:, monitoring:): its members carry the prose."""
    return bool(node) and node.get("type") == "object" and node.get("additionalProperties") is False


def documented_values() -> list[tuple[tuple[str, ...], bool]]:
    """(path, has a comment directly above) for every value in values.yaml, outside free-form blocks."""
    out = []
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in VALUES.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("-"):
            previous = line if stripped else previous
            continue
        if stripped.startswith("#"):
            previous = line
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = stripped.split(":", 1)[0]
        parent = tuple(k for _, k in stack)
        if not parent or is_section(schema_node(parent)):
            out.append((parent + (key,), previous.strip().startswith("#")))
        stack.append((indent, key))
        previous = line
    return out


def test_every_value_has_prose_directly_above_it():
    values = documented_values()
    assert len(values) > 40
    undocumented = [".".join(path) for path, commented in values if not commented and not is_section(schema_node(path))]
    assert not undocumented, f"values without a comment above them: {undocumented}"


def test_every_value_is_described_in_docs_chart_md():
    docs = (REPO / "docs" / "chart.md").read_text()
    missing = [
        ".".join(path)
        for path, _ in documented_values()
        if not is_section(schema_node(path)) and f"`{'.'.join(path)}`" not in docs
    ]
    assert not missing, f"docs/chart.md does not describe: {missing}"


def test_the_default_values_satisfy_the_schema_and_the_schema_knows_every_value():
    values = yaml.safe_load(VALUES.read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(values)
    for path, _ in documented_values():
        assert schema_node(path) is not None, f"values.schema.json lacks {'.'.join(path)}"


def _chart_values_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("chart_values", REPO / "scripts" / "chart_values.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_schema_and_the_docs_table_are_generated_from_values_yaml(tmp_path):
    chart_values = _chart_values_script()
    assert chart_values.stale_files() == [], "run .venv/bin/python scripts/chart_values.py"
    # A value added to values.yaml without regenerating makes both files stale.
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "values.yaml").write_text(
        VALUES.read_text() + "\n# How many widgets.\n# @schema {minimum: 1}\nwidgets: 2\n"
    )
    (chart / "values.schema.json").write_text((CHART / "values.schema.json").read_text())
    (tmp_path / "chart.md").write_text((REPO / "docs" / "chart.md").read_text())
    assert chart_values.stale_files(chart, tmp_path / "chart.md") == [
        str(chart / "values.schema.json"),
        str(tmp_path / "chart.md"),
    ]
    schema, table = chart_values.render((chart / "values.yaml").read_text())
    assert json.loads(schema)["properties"]["widgets"] == {
        "type": "integer",
        "minimum": 1,
        "description": "How many widgets.",
    }
    assert "| `widgets` | `2` | How many widgets. |" in table
    with pytest.raises(ValueError, match="gadgets has no prose"):
        chart_values.render(VALUES.read_text() + "\ngadgets: 1\n")


def test_helm_lint_strict_passes_for_defaults_and_with_every_feature_on(helm):
    for extra in (
        [],
        [
            "--set",
            "operator.replicas=2,rbac.scope=namespace,monitoring.grafanaDashboard.enabled=true,"
            "exampleInferenceService.enabled=true",
        ],
    ):
        result = subprocess.run(
            [helm, "lint", "--strict", str(CHART), *extra], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("values", "api_versions", "message"),
    [
        ({"rbac.scope": "cluster-wide"}, (), "value must be one of 'cluster', 'namespace'"),
        ({"operator.replicas": 0}, (), "/operator/replicas"),
        ({"operator.replicass": 2}, (), "additional properties 'replicass' not allowed"),
        ({"operator.podSecurityContext.runAsNonRoot": False}, (), "/operator/podSecurityContext/runAsNonRoot"),
        ({"operator.containerSecurityContext.allowPrivilegeEscalation": True}, (), "allowPrivilegeEscalation"),
        ({"operator.image.digest": "latest"}, (), "/operator/image/digest"),
        ({"monitoring.prometheusRule.prefixCacheHitRatioThreshold": 70}, (), "prefixCacheHitRatioThreshold"),
        ({"monitoring.prometheusRule.kvCacheUsageFor": "ten minutes"}, (), "kvCacheUsageFor"),
        ({"exampleInferenceService.name": "Tiny_Model"}, (), "/exampleInferenceService/name"),
        ({"serviceAccount.create": False}, (), "serviceAccount.name is required when serviceAccount.create is false"),
        ({"operator.metricsPort": 8080}, (), "operator.healthPort and operator.metricsPort must differ"),
        ({"operator.extraArgs": ["--namespace=other"]}, (), "operator.extraArgs must not set --namespace"),
        ({"operator.extraArgs": ["--standalone"]}, (), "operator.extraArgs must not set --standalone"),
        ({"monitoring.engine.podMonitor.enabled": True}, (), "needs the prometheus-operator CRDs"),
        ({"monitoring.prometheusRule.enabled": True}, (), "needs the prometheus-operator CRDs"),
    ],
)
def test_impossible_values_fail_the_install_naming_the_value(helm, values, api_versions, message):
    with pytest.raises(RenderError) as caught:
        helm_template(helm, set_values=values, api_versions=api_versions)
    assert message in str(caught.value)


def test_monitoring_renders_once_the_cluster_serves_prometheus_operator(helm):
    rendered = helm_template(
        helm, set_values={"monitoring.engine.podMonitor.enabled": True}, api_versions=(MONITORING_API,)
    )
    assert rendered.one("PodMonitor")


def test_an_existing_service_account_is_used_as_named(helm):
    rendered = helm_template(helm, set_values={"serviceAccount.create": False, "serviceAccount.name": "mine"})
    assert not rendered.of_kind("ServiceAccount")
    assert rendered.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    assert rendered.one("ClusterRoleBinding")["subjects"][0]["name"] == "mine"


def test_rbac_can_be_left_to_the_cluster_admin(helm):
    kinds = helm_template(helm, set_values={"rbac.create": False}).kinds()
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def test_clusters_older_than_the_charts_kube_version_are_refused(helm):
    with pytest.raises(RenderError, match="incompatible with Kubernetes v1.27"):
        helm_template(helm, extra_args=("--kube-version", "1.27.0"))
    assert helm_template(helm, extra_args=("--kube-version", "1.28.0")).one("Deployment")
