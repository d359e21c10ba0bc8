"""The autoscaling decision behaves like the Kubernetes HPA, case by case."""

from __future__ import annotations

import pytest

from pagedinfer.operator.autoscaling.policy import (
    NO_KV_PRESSURE,
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
from pagedinfer.operator.autoscaling.spec import parse_autoscaling_spec

FAST = {"stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 1}]}


def make_spec(metrics=None, min_replicas=1, max_replicas=10, scale_up=FAST, scale_down=FAST, **extra):
    autoscaling = {
        "enabled": True,
        "metrics": metrics or [{"name": "kvCacheUsage", "target": 0.5}],
        "scaleUp": scale_up,
        "scaleDown": scale_down,
        **extra,
    }
    return parse_autoscaling_spec(
        {"minReplicas": min_replicas, "maxReplicas": max_replicas, "autoscaling": autoscaling}
    )


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


KV_AND_HIT_RATE = [{"name": "kvCacheUsage", "target": 0.5}, {"name": "prefixCacheHitRate", "target": 0.6}]


def test_a_low_hit_rate_scales_up_only_while_kv_usage_is_above_its_target():
    spec = make_spec(KV_AND_HIT_RATE)
    # KV 0.6 / 0.5 asks for ceil(2 * 1.2) = 3; the hit rate, pool under pressure, for ceil(2 * 0.6 / 0.2) = 6
    pressed = once(spec, observe(2, kvCacheUsage=(0.6, 2), prefixCacheHitRate=(0.2, 2)))
    assert pressed.desired_replicas == 6
    assert pressed.reason.startswith("prefixCacheHitRate 0.2 below target 0.6: 2 -> 6 replicas")
    assert once(spec, observe(2, kvCacheUsage=(0.6, 2), prefixCacheHitRate=(0.0, 2))).desired_replicas == 10
    # The same hit rate with room in the pool (KV within tolerance of its target): no vote, no change.
    roomy = once(spec, observe(2, kvCacheUsage=(0.52, 2), prefixCacheHitRate=(0.2, 2)))
    assert roomy.metrics[1].status == NO_KV_PRESSURE and roomy.metrics[1].replicas is None
    assert roomy.desired_replicas == 2 and roomy.reason.startswith("kvCacheUsage")


def test_the_hit_rate_never_holds_a_scale_down_that_kv_usage_allows():
    spec = make_spec(KV_AND_HIT_RATE)
    assert once(spec, observe(4, kvCacheUsage=(0.1, 4), prefixCacheHitRate=(0.9, 4))).desired_replicas == 1
    low = once(spec, observe(4, kvCacheUsage=(0.1, 4), prefixCacheHitRate=(0.05, 4)))
    assert low.desired_replicas == 1 and low.metrics[1].status == NO_KV_PRESSURE


def test_a_hit_rate_that_falls_with_replicas_does_not_run_away():
    """Behind a ClusterIP Service each replica sees every prefix at 1/N of the
    rate: per-pod KV usage and hit rate both fall as replicas are added. The
    reviewer's trace (KV usage 5 %, hit rate 5 %, target 0.5) went
    2 -> 6 -> 12 -> 16 = maxReplicas under the old rule; now KV usage, far
    below its target, lets the fleet shrink and the hit rate stays silent."""
    spec = make_spec(
        [{"name": "kvCacheUsage", "target": 0.7}, {"name": "prefixCacheHitRate", "target": 0.5}],
        max_replicas=16,
        scale_down={"stabilizationWindowSeconds": 30, "policies": FAST["policies"]},
    )
    replicas, state, trace = 2, AutoscalerState(), []
    for step in range(12):
        per_pod = 0.1 / replicas  # 5 % at 2 replicas, for both metrics
        decision = decide(
            spec,
            observe(replicas, kvCacheUsage=(per_pod, replicas), prefixCacheHitRate=(per_pod, replicas)),
            state,
            step * 15.0,
        )
        assert decision.metrics[1].status == NO_KV_PRESSURE
        replicas, state = decision.desired_replicas, decision.state
        trace.append(replicas)
    assert max(trace) == 2 and trace[-1] == 1, trace


def test_under_kv_pressure_the_hit_rate_scales_up_until_the_pressure_is_gone_then_abstains():
    """A fixed load that fills 1.6 pools (KV usage 1.6 / N per pod) and loses
    prefixes while the pool is past its target: the hit rate votes only in
    the rounds where KV usage is above target (by more than the tolerance),
    and the fleet then stays where KV usage keeps it."""
    spec = make_spec(
        KV_AND_HIT_RATE,
        max_replicas=16,
        scale_up={"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 15}]},
        scale_down={"stabilizationWindowSeconds": 60, "policies": FAST["policies"]},
    )
    replicas, state, trace = 1, AutoscalerState(), []
    for step in range(20):
        kv = min(1.0, 1.6 / replicas)
        hit = 0.1 if kv > 0.55 else 0.3  # evicting while the pool is past its target; low anyway (spread)
        decision = decide(
            spec, observe(replicas, kvCacheUsage=(kv, replicas), prefixCacheHitRate=(hit, replicas)), state, step * 15.0
        )
        voted = decision.metrics[1].replicas is not None
        assert voted == (kv > 0.5 * 1.1), (step, kv, decision.metrics[1])
        replicas, state = decision.desired_replicas, decision.state
        trace.append(replicas)
    # Round 0: KV alone asks for 2, the hit rate for 6, the scaleUp policy allows 3. At 3 KV usage
    # is 0.53, within the tolerance of 0.5: no pressure, the hit rate abstains, nothing moves.
    assert trace == [3] * 20, trace


def test_the_reason_names_max_replicas_when_it_bound_the_result():
    spec = make_spec(max_replicas=16)
    held = once(spec, observe(16, kvCacheUsage=(1.0, 16)))
    assert held.desired_replicas == 16
    assert "is right" not in held.reason
    assert held.reason == "kvCacheUsage 1 above target 0.5 recommends 32 replicas; capped at maxReplicas 16: holding 16"
    moved = once(spec, observe(12, kvCacheUsage=(1.0, 12)))
    assert moved.reason == (
        "kvCacheUsage 1 above target 0.5: 12 -> 16 replicas (recommended 24 replicas; capped at maxReplicas 16)"
    )
    # A hit rate of 0 asks for as many as allowed: more than KV usage's 24, which its reason reads as 10.
    thrashing = once(make_spec(KV_AND_HIT_RATE), observe(4, kvCacheUsage=(0.6, 4), prefixCacheHitRate=(0.0, 4)))
    assert thrashing.reason == (
        "prefixCacheHitRate 0 below target 0.6: 4 -> 10 replicas "
        "(recommended as many replicas as allowed; capped at maxReplicas 10)"
    )
    beyond = once(make_spec(KV_AND_HIT_RATE), observe(4, kvCacheUsage=(3.0, 4), prefixCacheHitRate=(0.0, 4)))
    assert beyond.reason.startswith("prefixCacheHitRate 0 below target 0.6: 4 -> 10 replicas")


def test_the_reason_names_min_replicas_and_the_rate_limit_when_they_bound_the_result():
    floor = once(make_spec(min_replicas=2), observe(2, kvCacheUsage=(0.0, 2)))
    assert floor.reason == "kvCacheUsage 0 below target 0.5 recommends 0 replicas; raised to minReplicas 2: holding 2"
    one_step = {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}
    spec = make_spec(scale_up=one_step)
    first = once(spec, observe(2, kvCacheUsage=(1.0, 2)), now=0.0)
    assert (
        first.reason
        == "kvCacheUsage 1 above target 0.5: 2 -> 3 replicas (recommended 4; limited to 3 by scaleUp policies)"
    )
    second = once(spec, observe(3, kvCacheUsage=(1.0, 3)), first.state, now=15.0)
    assert second.reason.endswith("recommends 6 replicas; limited to 3 by scaleUp policies: holding 3")


def test_hit_rate_without_traffic_abstains_and_does_not_block_other_metrics():
    spec = make_spec(KV_AND_HIT_RATE)
    decision = once(spec, observe(4, kvCacheUsage=(0.1, 4), prefixCacheHitRate=None))
    assert decision.metrics[1].status == NO_TRAFFIC
    assert decision.desired_replicas == 1


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
    policies = [
        {"type": "Pods", "value": 1, "periodSeconds": 10},
        {"type": "Percent", "value": 50, "periodSeconds": 10},
    ]
    spec = make_spec(max_replicas=20, scale_up={"stabilizationWindowSeconds": 0, "policies": policies})
    decision = once(spec, observe(4, kvCacheUsage=(1.0, 4)))
    assert decision.desired_replicas == 6  # max(4 + 1, ceil(4 * 1.5))
    assert "limited to 6 by scaleUp policies" in decision.reason
    strict = make_spec(
        max_replicas=20, scale_up={"stabilizationWindowSeconds": 0, "policies": policies, "selectPolicy": "Min"}
    )
    assert once(strict, observe(4, kvCacheUsage=(1.0, 4))).desired_replicas == 5


def test_rate_limit_counts_changes_already_made_in_the_period():
    spec = make_spec(
        scale_up={"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]}
    )
    first = once(spec, observe(2, kvCacheUsage=(1.0, 2)), now=0.0)
    assert first.desired_replicas == 4
    second = once(spec, observe(4, kvCacheUsage=(1.0, 4)), first.state, now=30.0)
    assert second.desired_replicas == 4  # already +2 within 60 s
    assert once(spec, observe(4, kvCacheUsage=(1.0, 4)), second.state, now=61.0).desired_replicas == 6


def test_scale_down_percent_policy_rounds_toward_fewer_removals():
    spec = make_spec(
        scale_down={
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
        }
    )
    assert once(spec, observe(5, kvCacheUsage=(0.0, 5))).desired_replicas == 2  # floor(5 * 0.5)


def test_disabled_direction_never_moves():
    spec = make_spec(
        scale_down={"stabilizationWindowSeconds": 0, "selectPolicy": "Disabled", "policies": FAST["policies"]}
    )
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
