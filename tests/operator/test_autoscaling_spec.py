"""spec.autoscaling parses into validated dataclasses with HPA's defaults, and
every bad field is rejected with a ValueError naming it."""

from __future__ import annotations

import pytest

from pagedinfer.operator.autoscaling.spec import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    MetricTarget,
    ScalingPolicy,
    parse_autoscaling_spec,
)


def minimal(min_replicas=1, max_replicas=4, **overrides):
    autoscaling = {"enabled": True, "metrics": [{"name": "kvCacheUsage", "target": 0.7}], **overrides}
    return {"replicas": 1, "minReplicas": min_replicas, "maxReplicas": max_replicas, "autoscaling": autoscaling}


def test_defaults_follow_hpa():
    spec = parse_autoscaling_spec(minimal())
    assert spec.interval_seconds == 15
    assert spec.tolerance == 0.1
    assert spec.scale_up == DEFAULT_SCALE_UP
    assert spec.scale_up.stabilization_window_seconds == 0
    assert spec.scale_down == DEFAULT_SCALE_DOWN
    assert spec.scale_down.stabilization_window_seconds == 300
    assert spec.source.type == "direct"
    assert spec.metrics == (MetricTarget("kvCacheUsage", 0.7),)


def test_absent_spec_is_disabled():
    assert parse_autoscaling_spec({"replicas": 3}).enabled is False
    assert parse_autoscaling_spec({"autoscaling": {"enabled": False}}).enabled is False


def test_bounds_come_from_the_inference_service_spec():
    spec = parse_autoscaling_spec(minimal(min_replicas=0, max_replicas=3))
    assert (spec.min_replicas, spec.max_replicas) == (1, 3)
    with pytest.raises(ValueError, match=r"spec\.maxReplicas is required"):
        parse_autoscaling_spec({"autoscaling": minimal()["autoscaling"]})


def test_full_spec_round_trips():
    spec = parse_autoscaling_spec(
        minimal(
            intervalSeconds=2,
            tolerance=0.05,
            metrics=[
                {"name": "kvCacheUsage", "target": 0.6},
                {"name": "prefixCacheHitRate", "target": 0.5},
                {"name": "requestsWaiting", "target": 3},
            ],
            scaleUp={"stabilizationWindowSeconds": 10, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 5}]},
            scaleDown={"stabilizationWindowSeconds": 6, "selectPolicy": "Min"},
            source={"type": "prometheus", "url": "http://prometheus:9090"},
            scrapeTimeoutSeconds=1.5,
            scrapeConcurrency=2,
        )
    )
    assert spec.metrics[1].inverted and not spec.metrics[0].inverted
    assert spec.scale_up.policies == (ScalingPolicy("Pods", 1, 5),)
    assert spec.scale_down.policies == DEFAULT_SCALE_DOWN.policies
    assert spec.scale_down.select_policy == "Min"
    assert spec.source.url == "http://prometheus:9090"
    assert spec.history_seconds == 15


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"metrics": [{"name": "cpu", "target": 0.5}]}, "metrics[0]"),
        ({"metrics": [{"name": "kvCacheUsage", "target": 1.5}]}, "target"),
        ({"metrics": [{"name": "requestsWaiting", "target": 0}]}, "target"),
        ({"metrics": [{"name": "kvCacheUsage"}]}, "metrics[0]"),
        ({"metrics": [{"name": "kvCacheUsage", "target": 0.5}] * 2}, "twice"),
        ({"metrics": []}, "metrics"),
        ({"metrics": [{"name": "prefixCacheHitRate", "target": 0.5}]}, "needs kvCacheUsage listed too"),
        ({"min_replicas": -1}, "spec.minReplicas"),
        ({"max_replicas": 0}, "spec.maxReplicas"),
        ({"min_replicas": 3, "max_replicas": 2}, "spec.maxReplicas"),
        ({"intervalSeconds": 0}, "intervalSeconds"),
        ({"tolerance": 1.0}, "tolerance"),
        ({"tolerance": "0.1"}, "tolerance"),
        ({"enabled": "yes"}, "enabled"),
        ({"scaleUp": {"policies": []}}, "scaleUp.policies"),
        ({"scaleUp": {"policies": [{"type": "Nodes", "value": 1, "periodSeconds": 5}]}}, "scaleUp.policies[].type"),
        ({"scaleDown": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 5}]}}, "scaleDown.policies[].value"),
        ({"scaleDown": {"stabilizationWindowSeconds": -1}}, "scaleDown.stabilizationWindowSeconds"),
        ({"scaleDown": {"selectPolicy": "Fastest"}}, "scaleDown.selectPolicy"),
        ({"source": {"type": "prometheus"}}, "source.url"),
        ({"source": {"type": "statsd"}}, "source.type"),
        ({"scrapeTimeoutSeconds": 0}, "scrapeTimeoutSeconds"),
        ({"scrapeConcurrency": 0}, "scrapeConcurrency"),
    ],
)
def test_bad_fields_are_named(overrides, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_autoscaling_spec(minimal(**overrides))


def test_the_hit_rate_needs_prefix_caching_on_in_the_engine():
    """With prefix caching off the engine's hit rate is always 0, which would vote for maxReplicas."""
    both = [{"name": "kvCacheUsage", "target": 0.5}, {"name": "prefixCacheHitRate", "target": 0.5}]
    spec = {**minimal(metrics=both), "engine": {"enablePrefixCaching": False}}
    with pytest.raises(
        ValueError,
        match=r"spec\.autoscaling\.metrics: prefixCacheHitRate needs "
        r"spec\.engine\.enablePrefixCaching: true",
    ):
        parse_autoscaling_spec(spec)
    assert parse_autoscaling_spec({**spec, "engine": {"enablePrefixCaching": True}}).metrics[1].inverted
    assert parse_autoscaling_spec(minimal(metrics=both)).metrics[1].inverted  # the default is on
    kv_only = {**minimal(), "engine": {"enablePrefixCaching": False}}
    assert parse_autoscaling_spec(kv_only).metrics[0].name == "kvCacheUsage"
