"""Alerts and dashboard queries parse as PromQL and use only metrics that exist.

The names are contracts/metric_names.py, the one list the server, the
router and the operator register from (tests/server/test_metric_names.py
proves each exposes exactly its part, and that docs/design.md lists the
server's). A renamed metric breaks these tests instead of silently blanking
a panel or muting an alert.
"""

from __future__ import annotations

import json

import promql_parser
import pytest
from helm_chart import CHART, MONITORING_API, helm_template

from pagedinfer.contracts import metric_names

GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$namespace": ".*", "$model": ".*"}
ALERTS = {
    "PagedInferKVCacheNearlyFull",
    "PagedInferPrefixCacheHitRateLow",
    "PagedInferKVBlockAllocationFailures",
    "PagedInferPreemptionsRising",
    "PagedInferOperatorReconcileErrors",
}


def selectors(node) -> list[str]:
    """Metric names of every vector selector in a parsed PromQL expression."""
    if type(node).__name__ == "VectorSelector":
        return [node.name]
    out = []
    for attr in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
        child = getattr(node, attr, None)
        for item in child if isinstance(child, (list, tuple)) else [child]:
            if item is not None and not isinstance(item, (str, int, float)):
                out += selectors(item)
    return out


def assert_uses_known_metrics(expr: str, where: str) -> None:
    try:
        names = selectors(promql_parser.parse(expr))
    except ValueError as exc:
        raise AssertionError(f"{where}: not valid PromQL ({exc}): {expr}") from exc
    assert names, f"{where}: selects no metric"
    for name in names:
        assert name in metric_names.exposed_series(), f"{where}: {name} is not in contracts/metric_names.py"


def test_the_metric_contract_is_readable():
    assert {
        "pagedinfer_kv_cache_usage_ratio",
        "pagedinfer_time_to_first_token_seconds_bucket",
    } <= metric_names.exposed_series(metric_names.SERVER)
    assert "pagedinfer_operator_reconcile_errors_total" in metric_names.exposed_series(metric_names.OPERATOR)


def test_a_query_of_a_name_outside_metric_names_fails():
    with pytest.raises(AssertionError, match="pagedinfer_kv_cache_usage is not in"):
        assert_uses_known_metrics("max(pagedinfer_kv_cache_usage) > 0.9", "test")
    assert_uses_known_metrics("rate(pagedinfer_time_to_first_token_seconds_bucket[5m])", "test")


def rules(helm, **values):
    rendered = helm_template(
        helm, set_values={"monitoring.prometheusRule.enabled": True, **values}, api_versions=(MONITORING_API,)
    )
    return [r for group in rendered.one("PrometheusRule")["spec"]["groups"] for r in group["rules"]]


def test_every_alert_is_valid_promql_over_real_metrics(helm):
    alerts = rules(helm)
    assert {r["alert"] for r in alerts} == ALERTS
    for rule in alerts:
        assert_uses_known_metrics(rule["expr"], rule["alert"])
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_alert_thresholds_follow_the_values(helm):
    by_name = {
        r["alert"]: r
        for r in rules(
            helm,
            **{
                "monitoring.prometheusRule.kvCacheUsageRatioThreshold": 0.8,
                "monitoring.prometheusRule.kvCacheUsageFor": "15m",
                "monitoring.prometheusRule.prefixCacheHitRatioThreshold": 0.5,
                "monitoring.prometheusRule.alertLabels": {"team": "ml"},
            },
        )
    }
    kv = by_name["PagedInferKVCacheNearlyFull"]
    assert kv["expr"].endswith("> 0.8") and kv["for"] == "15m"
    assert by_name["PagedInferPrefixCacheHitRateLow"]["expr"].endswith("< 0.5")
    assert all(r["labels"]["team"] == "ml" for r in by_name.values())


def test_the_dashboard_queries_parse_and_cover_the_promised_panels():
    dashboard = json.loads((CHART / "files" / "pagedinfer-dashboard.json").read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for needed in (
        "KV cache usage",
        "used / free / cached",
        "hit rate",
        "Time to first token",
        "Inter-token latency",
        "Replicas",
    ):
        assert needed in titles
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):  # a row has none
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: unknown Grafana variable in {target['expr']}"
            assert_uses_known_metrics(expr, panel["title"])


def test_the_dashboard_configmap_carries_the_json_unchanged(helm):
    rendered = helm_template(helm, set_values={"monitoring.grafanaDashboard.enabled": True})
    data = rendered.one("ConfigMap")["data"]["pagedinfer-dashboard.json"]
    assert json.loads(data) == json.loads((CHART / "files" / "pagedinfer-dashboard.json").read_text())


def test_the_router_podmonitor_selects_the_router_pods_the_operator_builds(helm):
    from pagedinfer.operator.children import builders
    from pagedinfer.operator.children.labels import common_labels
    from pagedinfer.operator.routing.builders import build_router_deployment
    from pagedinfer.operator.spec.parser import parse_spec

    monitor = helm_template(
        helm, set_values={"monitoring.router.podMonitor.enabled": True}, api_versions=(MONITORING_API,)
    ).one("PodMonitor")
    owner = builders.Owner(name="llama", namespace="team-a", uid="uid-1")
    spec = parse_spec("llama", {"resources": {"gpus": 0}, "router": {"enabled": True}})
    template = build_router_deployment(owner, spec, "router:1")["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= common_labels("llama").items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in template["spec"]["containers"][0]["ports"]}


def test_the_dashboard_has_a_routing_row_of_decisions_and_per_engine_hit_rate():
    panels = json.loads((CHART / "files" / "pagedinfer-dashboard.json").read_text())["panels"]
    titles = [p["title"] for p in panels]
    row = titles.index("Routing (spec.router)")
    assert panels[row]["type"] == "row"
    exprs = " ".join(t["expr"] for p in panels[row + 1 :] for t in p["targets"])
    assert "sum by (reason, engine) (rate(pagedinfer_router_decisions_total" in exprs
    assert "sum by (pod) (rate(pagedinfer_prefix_cache_hits_total" in exprs


def test_the_engine_podmonitor_selects_the_pods_the_operator_builds(helm):
    from pagedinfer.operator.children import builders
    from pagedinfer.operator.kv_plan.planning import KVCachePlan
    from pagedinfer.operator.spec.parser import parse_spec

    monitor = helm_template(
        helm, set_values={"monitoring.engine.podMonitor.enabled": True}, api_versions=(MONITORING_API,)
    ).one("PodMonitor")
    owner = builders.Owner(name="llama", namespace="team-a", uid="uid-1")
    plan = KVCachePlan(source="engine", block_size=16, num_gpu_blocks=None)
    spec = parse_spec("llama", {"resources": {"gpus": 0}})
    template = builders.build_deployment(owner, spec, plan)["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}  # cluster scope: engines in every namespace
