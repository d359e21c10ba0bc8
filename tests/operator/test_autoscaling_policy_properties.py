"""Properties of the autoscaling decision, over random specs and load traces:
never outside the bounds, no flapping within tolerance, a constant load
converges, rate limits and stabilization windows hold over whole traces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pagedinfer.operator.autoscaling.policy import AutoscalerState, MetricSample, Observation, decide
from pagedinfer.operator.autoscaling.spec import parse_autoscaling_spec

METRICS = ("kvCacheUsage", "prefixCacheHitRate", "requestsWaiting")
INTERVAL_SECONDS = 15.0

policies = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["Pods", "Percent"]),
            "value": st.integers(1, 200),
            "periodSeconds": st.sampled_from([15, 30, 60]),
        }
    ),
    min_size=1,
    max_size=3,
)
rules = st.fixed_dictionaries(
    {"stabilizationWindowSeconds": st.sampled_from([0, 15, 45, 120]), "policies": policies},
    optional={"selectPolicy": st.sampled_from(["Max", "Min"])},
)


@st.composite
def specs(draw, metric_names=st.sets(st.sampled_from(METRICS), min_size=1)):
    min_replicas = draw(st.integers(1, 4))
    names = set(draw(metric_names))
    if "prefixCacheHitRate" in names:
        names.add("kvCacheUsage")  # the hit rate is only valid next to it
    names = sorted(names)
    autoscaling = {
        "enabled": True,
        "tolerance": draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])),
        "metrics": [{"name": n, "target": draw(_targets(n))} for n in names],
        "scaleUp": draw(rules),
        "scaleDown": draw(rules),
    }
    return parse_autoscaling_spec(
        {"minReplicas": min_replicas, "maxReplicas": draw(st.integers(min_replicas, 12)), "autoscaling": autoscaling}
    )


def _targets(name):
    if name == "requestsWaiting":
        return st.floats(0.5, 10)
    return st.floats(0.05, 1.0)


def _sample_values(name):
    if name == "requestsWaiting":
        return st.floats(0, 50)
    return st.floats(0, 1)


@st.composite
def observations(draw, spec, current):
    ready = draw(st.integers(0, current + 2))
    failed = draw(st.integers(0, ready))
    metrics = {}
    for m in spec.metrics:
        with_data = draw(st.integers(0, ready - failed))
        value = draw(_sample_values(m.name)) if with_data else None
        metrics[m.name] = MetricSample(value, with_data)
    return Observation(current, ready, failed, metrics)


def _evenly_loaded(spec, replicas, load):
    """A constant total load shared evenly, as a ClusterIP Service spreads it:
    per-pod KV usage and waiting requests shrink as 1/replicas, and so does
    the hit rate (each replica sees each prefix at 1/replicas of the rate):
    the adversarial case for a metric that asks for replicas when it is low."""
    metrics = {}
    for m in spec.metrics:
        if m.name == "prefixCacheHitRate":
            value = min(1.0, load / (replicas * 4)) if load else None
        elif m.name == "kvCacheUsage":
            value = min(1.0, load / replicas)
        else:
            value = load * 5 / replicas
        metrics[m.name] = MetricSample(value, replicas if value is not None else 0)
    return Observation(replicas, replicas, 0, metrics)


def _run(spec, start, loads):
    """Apply decisions step by step; returns [(time, decision)]."""
    replicas, state, trace = start, AutoscalerState(), []
    for step, load in enumerate(loads):
        now = step * INTERVAL_SECONDS
        decision = decide(spec, _evenly_loaded(spec, replicas, load), state, now)
        trace.append((now, decision))
        replicas, state = decision.desired_replicas, decision.state
    return trace


@settings(max_examples=300, deadline=None)
@given(data=st.data(), spec=specs())
def test_never_outside_the_bounds(data, spec):
    current = data.draw(st.integers(1, 15))
    state = AutoscalerState()
    for step in range(4):
        obs = data.draw(observations(spec, current))
        decision = decide(spec, obs, state, step * INTERVAL_SECONDS)
        assert spec.min_replicas <= decision.desired_replicas <= spec.max_replicas
        current, state = decision.desired_replicas, decision.state


@settings(max_examples=300, deadline=None)
@given(data=st.data(), spec=specs())
def test_no_change_when_every_metric_is_within_tolerance(data, spec):
    current = data.draw(st.integers(spec.min_replicas, spec.max_replicas))
    metrics = {}
    for m in spec.metrics:
        ratio = data.draw(st.floats(1 - spec.tolerance, 1 + spec.tolerance))
        value = m.target / ratio if m.inverted else m.target * ratio
        metrics[m.name] = MetricSample(value, current)
    state = AutoscalerState()
    for step in range(3):
        decision = decide(spec, Observation(current, current, 0, metrics), state, step * INTERVAL_SECONDS)
        assert decision.desired_replicas == current
        state = decision.state


@settings(max_examples=200, deadline=None)
@given(spec=specs(), start=st.integers(1, 12), load=st.floats(0.05, 6))
def test_a_constant_load_converges_to_a_fixed_point(spec, start, load):
    trace = _run(spec, start, [load] * 60)
    tail = [d.desired_replicas for _, d in trace[-10:]]
    assert len(set(tail)) == 1
    assert all(not d.changed for _, d in trace[-10:])


@settings(max_examples=200, deadline=None)
@given(
    spec=specs(),
    loads=st.lists(st.floats(0.0, 6), min_size=5, max_size=40),
    value=st.integers(1, 3),
    period=st.sampled_from([15, 30, 60]),
)
def test_pods_rate_limits_hold_over_every_period(spec, loads, value, period):
    one_policy = {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": value, "periodSeconds": period}],
    }
    autoscaling = {
        "enabled": True,
        "tolerance": spec.tolerance,
        "metrics": [{"name": m.name, "target": m.target} for m in spec.metrics],
        "scaleUp": one_policy,
        "scaleDown": one_policy,
    }
    raw = {"minReplicas": spec.min_replicas, "maxReplicas": spec.max_replicas, "autoscaling": autoscaling}
    trace = _run(parse_autoscaling_spec(raw), spec.min_replicas, loads)
    changes = [(t, d.desired_replicas - d.current_replicas) for t, d in trace]
    for t, _ in changes:
        in_window = [c for when, c in changes if t - period < when <= t]
        assert sum(c for c in in_window if c > 0) <= value
        assert -sum(c for c in in_window if c < 0) <= value


@settings(max_examples=200, deadline=None)
@given(spec=specs(), loads=st.lists(st.floats(0.0, 6), min_size=5, max_size=40), start=st.integers(1, 12))
def test_stabilization_windows_bound_every_move(spec, loads, start):
    trace = _run(spec, start, loads)
    recommendations = [(t, d.recommended_replicas) for t, d in trace if d.recommended_replicas is not None]
    for t, d in trace:
        if not spec.min_replicas <= d.current_replicas <= spec.max_replicas:
            continue
        if d.desired_replicas < d.current_replicas:
            window = spec.scale_down.stabilization_window_seconds
            recent = [r for when, r in recommendations if when == t or t - window < when <= t]
            assert d.desired_replicas >= max(recent)
        if d.desired_replicas > d.current_replicas:
            window = spec.scale_up.stabilization_window_seconds
            recent = [r for when, r in recommendations if when == t or t - window < when <= t]
            assert d.desired_replicas <= min(recent)
