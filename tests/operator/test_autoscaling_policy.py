"""The autoscaling decision behaves like the Kubernetes HPA, case by case."""

from __future__ import annotations

import pytest

from pagedinfer.operator.autoscaling_policy import (
    NO_TRAFFIC,
    REVERSED,
    UNAVAILABLE,
    WITHIN_TOLERANCE,
    AutoscalerState,
    MetricSample,
    Observation,
    TimedReplicas,
    decide,
)
from pagedinfer.operator.autoscaling_spec import parse_autoscaling_spec

FAST = {"stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 1}]}


def make_spec(metrics=None, min_replicas=1, max_replicas=10, scale_up=FAST, scale_down=FAST, **extra):
    autoscaling = {
        "enabled": True,
        "metrics": metrics or [{"name": "kvCacheUsage", "target": 0.5}],
        "scaleUp": scale_up,
        "scaleDown": scale_down,
        **extra,
    }
    return parse_autoscaling_spec({"minReplicas": min_replicas, "maxReplicas": max_replicas, "autoscaling": autoscaling})


def observe(current, ready=None, failed=0, **metrics):
    """observe(3, kvCacheUsage=(0.9, 3)) -> Observation with that metric from 3 pods."""
    ready = current if ready is None else ready
    samples = {name: MetricSample(*v) if v is not None else MetricSample(None, 0) for name, v in metrics.items()}
    return Observation(current, ready, failed, samples)


def once(spec, obs, state=AutoscalerState(), now=1000.0):
    return decide(spec, obs, state, now)


@pytest.mark.parametrize(
    "current, value, expected",
    [
        (2, 0.9, 4),  # ceil(2 * 0.9 / 0.5) = ceil(3.6)
        (4, 0.25, 2),  # ceil(4 * 0.5)
        (3, 0.54, 3),  # ratio 1.08 within tolerance 0.1
        (3, 0.46, 3),  # ratio 0.92 within tolerance
        (3, 0.0, 1),  # idle: down to minReplicas
        (5, 0.6, 6),  # 6.000000000000001 must not become 7
        (8, 1.0, 10),  # clamped to maxReplicas
    ],
)
def test_kv_usage_follows_the_hpa_formula(current, value, expected):
    decision = once(make_spec(), observe(current, kvCacheUsage=(value, current)))
    assert decision.desired_replicas == expected


def test_hit_rate_below_target_scales_up_and_above_scales_down():
    spec = make_spec([{"name": "prefixCacheHitRate", "target": 0.6}])
    assert once(spec, observe(2, prefixCacheHitRate=(0.3, 2))).desired_replicas == 4  # ceil(2 * 0.6 / 0.3)
    assert once(spec, observe(4, prefixCacheHitRate=(0.9, 4))).desired_replicas == 3  # ceil(4 * 0.6 / 0.9)
    assert once(spec, observe(2, prefixCacheHitRate=(0.0, 2))).desired_replicas == 10  # thrashing: all the way


def test_hit_rate_without_traffic_abstains_and_does_not_block_other_metrics():
    spec = make_spec([{"name": "kvCacheUsage", "target": 0.5}, {"name": "prefixCacheHitRate", "target": 0.6}])
    decision = once(spec, observe(4, kvCacheUsage=(0.1, 4), prefixCacheHitRate=None))
    assert decision.metrics[1].status == NO_TRAFFIC
    assert decision.desired_replicas == 1
    only_hit_rate = make_spec([{"name": "prefixCacheHitRate", "target": 0.6}])
    held = once(only_hit_rate, observe(4, prefixCacheHitRate=None))
    assert held.desired_replicas == 4 and "no traffic" in held.reason


def test_requests_waiting_is_an_average_per_pod():
    spec = make_spec([{"name": "requestsWaiting", "target": 2}])
    assert once(spec, observe(2, requestsWaiting=(5.0, 2))).desired_replicas == 5


def test_largest_recommendation_wins_and_reason_names_it():
    spec = make_spec([{"name": "kvCacheUsage", "target": 0.5}, {"name": "requestsWaiting", "target": 2}])
    decision = once(spec, observe(2, kvCacheUsage=(0.9, 2), requestsWaiting=(6.0, 2)))
    assert decision.desired_replicas == 6
    assert decision.reason.startswith("requestsWaiting 6 above target 2: 2 -> 6 replicas")


def test_a_metric_within_tolerance_keeps_the_current_count_against_a_scale_down():
    spec = make_spec([{"name": "kvCacheUsage", "target": 0.5}, {"name": "requestsWaiting", "target": 2}])
    decision = once(spec, observe(4, kvCacheUsage=(0.52, 4), requestsWaiting=(0.0, 4)))
    assert decision.metrics[0].status == WITHIN_TOLERANCE
    assert decision.desired_replicas == 4


def test_missing_pods_count_as_idle_for_a_scale_up():
    # 2 of 4 pods report 0.8: (1.6 * 2 + 0 * 2) / 4 = 0.8 < 1 reverses the scale-up: hold
    decision = once(make_spec(), observe(4, kvCacheUsage=(0.8, 2)))
    assert decision.metrics[0].status == REVERSED
    assert decision.desired_replicas == 4
    # 2 of 3 report 1.0: (2 * 2 + 0) / 3 = 1.33 -> ceil(1.33 * 3) = 4
    assert once(make_spec(), observe(3, kvCacheUsage=(1.0, 2))).desired_replicas == 4


def test_missing_pods_count_as_at_target_for_a_scale_down():
    # 2 of 4 pods report 0.1: (0.2 * 2 + 1 * 2) / 4 = 0.6 -> ceil(0.6 * 4) = 3, not ceil(0.2 * 2) = 1
    assert once(make_spec(), observe(4, kvCacheUsage=(0.1, 2))).desired_replicas == 3


def test_unready_pods_damp_a_scale_up():
    # 4 replicas asked, 2 ready at 0.75: (1.5 * 2 + 0 * 2) / 4 = 0.75 reverses the scale-up: hold
    assert once(make_spec(), observe(4, ready=2, kvCacheUsage=(0.75, 2))).desired_replicas == 4
    # 3 asked, 2 ready at 1.0: (2 * 2) / 3 = 1.33 -> ceil(4) = 4
    assert once(make_spec(), observe(3, ready=2, kvCacheUsage=(1.0, 2))).desired_replicas == 4


def test_failed_scrapes_never_cause_a_scale_down():
    spec = make_spec([{"name": "kvCacheUsage", "target": 0.5}, {"name": "requestsWaiting", "target": 2}])
    decision = once(spec, observe(4, failed=4, kvCacheUsage=None, requestsWaiting=None))
    assert decision.desired_replicas == 4
    assert {m.status for m in decision.metrics} == {UNAVAILABLE}
    partial = once(spec, observe(4, failed=4, kvCacheUsage=None, requestsWaiting=(0.0, 4)))
    assert partial.desired_replicas == 4 and "never scale down" in partial.reason


def test_scale_up_proceeds_on_partial_metrics():
    spec = make_spec([{"name": "kvCacheUsage", "target": 0.5}, {"name": "requestsWaiting", "target": 2}])
    decision = once(spec, observe(2, failed=1, kvCacheUsage=None, requestsWaiting=(8.0, 1)))
    # 1 reporting pod at 4x target, 1 missing counted idle: (4 + 0) / 2 = 2 -> 4 replicas
    assert decision.desired_replicas == 4


def test_scale_down_takes_the_highest_recommendation_in_its_window():
    spec = make_spec(scale_down={"stabilizationWindowSeconds": 60, "policies": FAST["policies"]})
    state = AutoscalerState(recommendations=(TimedReplicas(950.0, 6), TimedReplicas(990.0, 5)), seeded=True)
    decision = once(spec, observe(6, kvCacheUsage=(0.1, 6)), state, now=1000.0)
    assert decision.recommended_replicas == 2
    assert decision.desired_replicas == 6
    assert "stabilization window" in decision.reason
    later = once(spec, observe(6, kvCacheUsage=(0.1, 6)), decision.state, now=1015.0)
    assert later.desired_replicas == 5  # the 6 at t=950 left the window; 5 (t=990) still in it
    assert once(spec, observe(5, kvCacheUsage=(0.1, 5)), later.state, now=1061.0).desired_replicas == 2


def test_a_fresh_history_is_seeded_with_the_current_count():
    spec = make_spec(scale_down={"stabilizationWindowSeconds": 30, "policies": FAST["policies"]})
    first = once(spec, observe(5, kvCacheUsage=(0.1, 5)), now=0.0)
    assert first.desired_replicas == 5
    assert once(spec, observe(5, kvCacheUsage=(0.1, 5)), first.state, now=31.0).desired_replicas == 1


def test_scale_up_takes_the_lowest_recommendation_in_its_window():
    spec = make_spec(scale_up={"stabilizationWindowSeconds": 30, "policies": FAST["policies"]})
    state = AutoscalerState(recommendations=(TimedReplicas(980.0, 3),))
    assert once(spec, observe(2, kvCacheUsage=(1.0, 2)), state).desired_replicas == 3


def test_rate_limits_pick_the_most_permissive_policy():
    policies = [{"type": "Pods", "value": 1, "periodSeconds": 10}, {"type": "Percent", "value": 50, "periodSeconds": 10}]
    spec = make_spec(max_replicas=20, scale_up={"stabilizationWindowSeconds": 0, "policies": policies})
    decision = once(spec, observe(4, kvCacheUsage=(1.0, 4)))
    assert decision.desired_replicas == 6  # max(4 + 1, ceil(4 * 1.5))
    assert "limited to 6 by scaleUp policies" in decision.reason
    strict = make_spec(max_replicas=20, scale_up={"stabilizationWindowSeconds": 0, "policies": policies, "selectPolicy": "Min"})
    assert once(strict, observe(4, kvCacheUsage=(1.0, 4))).desired_replicas == 5


def test_rate_limit_counts_changes_already_made_in_the_period():
    spec = make_spec(scale_up={"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]})
    first = once(spec, observe(2, kvCacheUsage=(1.0, 2)), now=0.0)
    assert first.desired_replicas == 4
    second = once(spec, observe(4, kvCacheUsage=(1.0, 4)), first.state, now=30.0)
    assert second.desired_replicas == 4  # already +2 within 60 s
    assert once(spec, observe(4, kvCacheUsage=(1.0, 4)), second.state, now=61.0).desired_replicas == 6


def test_scale_down_percent_policy_rounds_toward_fewer_removals():
    spec = make_spec(scale_down={"stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]})
    assert once(spec, observe(5, kvCacheUsage=(0.0, 5))).desired_replicas == 2  # floor(5 * 0.5)


def test_disabled_direction_never_moves():
    spec = make_spec(scale_down={"stabilizationWindowSeconds": 0, "selectPolicy": "Disabled", "policies": FAST["policies"]})
    assert once(spec, observe(5, kvCacheUsage=(0.0, 5))).desired_replicas == 5
    assert once(spec, observe(5, kvCacheUsage=(1.0, 5))).desired_replicas == 10


def test_out_of_bounds_current_is_clamped_at_once():
    spec = make_spec(min_replicas=2, max_replicas=4)
    decision = once(spec, observe(7, kvCacheUsage=(1.0, 7)))
    assert decision.desired_replicas == 4 and "maxReplicas" in decision.reason
    assert once(spec, observe(1, kvCacheUsage=(0.0, 1))).desired_replicas == 2


def test_zero_replicas_is_left_to_the_user():
    decision = once(make_spec(), observe(0, kvCacheUsage=None))
    assert decision.desired_replicas == 0 and not decision.changed


def test_state_forgets_what_is_older_than_every_window():
    spec = make_spec(scale_down={"stabilizationWindowSeconds": 20, "policies": FAST["policies"]})
    state = AutoscalerState(recommendations=(TimedReplicas(0.0, 9),), scale_events=(TimedReplicas(0.0, 3),))
    decision = once(spec, observe(3, kvCacheUsage=(0.5, 3)), state, now=100.0)
    assert all(r.time_seconds > 80.0 for r in decision.state.recommendations)
    assert decision.state.scale_events == ()
