"""The autoscaling decision: a pure function of spec, observation, history and time.

It follows the Kubernetes HorizontalPodAutoscaler controller
(https://kubernetes.io/docs/concepts/workloads/autoscaling/horizontal-pod-autoscale/#algorithm-details,
and KEP-853 "configurable scale velocity" for `behavior`), one step at a time:

1. Per metric, the usage ratio: value / target, or target / value for
   `prefixCacheHitRate` (a hit rate BELOW target asks for more replicas; see
   "The hit rate" below for when it may). A ratio above 1 asks for more
   replicas.
2. Per metric, the recommendation `ceil(ratio x pods_with_data)`; the current
   replica count instead when |ratio - 1| <= tolerance.
3. Missing data and unready pods, conservatively as HPA does: if the ratio
   says "down", ready pods without a value count as exactly at target
   (ratio 1); if it says "up", they count as idle (ratio 0), and so do unready
   pods (replicas asked for but not ready yet). The ratio is recomputed over
   the larger set; if that lands within tolerance or reverses the direction,
   the metric recommends the current count.
4. The hit rate votes only while `kvCacheUsage` asks for more replicas;
   otherwise it abstains (NO_KV_PRESSURE). Then the largest recommendation
   wins. A metric with no data at all because
   every scrape failed makes the whole decision hold unless some other
   metric asks for MORE replicas (HPA scales up on partial metrics, never
   down). A hit rate with zero query tokens in the interval (no traffic)
   abstains: it says nothing either way.
5. Stabilization: every raw recommendation is kept with its time. A scale
   up goes only to the LOWEST recommendation within `scaleUp`'s window; a
   scale down only to the HIGHEST within `scaleDown`'s window. A history is
   seeded with the current count, so a restarted operator does not scale
   down at once.
6. Rate limits: within each policy's period the replicas added (removed)
   may not exceed `value` pods or `value` percent of the count at the
   start of the period; `selectPolicy: Max` takes the most permissive
   policy, `Min` the strictest, `Disabled` forbids that direction.
7. Clamp to [minReplicas, maxReplicas]. A current count outside the bounds
   is brought inside at once (no rate limit), as HPA does. The reason names
   whatever bound the result: minReplicas/maxReplicas, a stabilization
   window, or a rate limit (the most a step may add or remove).

The hit rate. HPA's formula assumes a metric per pod falls as pods are
added (KV usage and waiting requests do: the same load over more pods). The
hit rate does not. Behind a plain ClusterIP Service, requests are spread
without regard to prefixes, so each replica sees every prefix at 1/N of the
rate and holds its own copy: more replicas LOWER each replica's hit rate.
Fed to the formula as it stands, a low hit rate asks for more replicas,
which lowers it further, up to maxReplicas and there to stay (KV usage 5 %
and hit rate 5 % against a target of 0.5 went 2 -> 6 -> 12 -> 16 = max).
What more replicas do fix is a pool too full to keep prefixes: the engine
evicts cached blocks (least recently used) to make room for running
sequences, and spreading the same load over more pools leaves each room to
keep them. So the hit rate asks for replicas only when both hold: it is
below target AND kvCacheUsage is above its own target by more than the
tolerance (the pool is under pressure: that metric itself votes to scale
up). It then asks for ceil(pods x target / hit rate), possibly more than
KV usage alone would, because lost prefixes are recomputed and re-occupy
the pool. The loop cannot run away: every round re-checks the pressure, and
the added replicas lower KV usage until kvCacheUsage stops asking, and the
hit rate falls silent with it. Without that pressure it abstains: it never
scales up on its own, and it never holds a scale-down that KV usage and the
other metrics allow (a high hit rate with a pool to spare lets the fleet
shrink; a low one there is not a shortage of cache that replicas would
fix). This is why `prefixCacheHitRate` must be listed with `kvCacheUsage`
(autoscaling_spec).

Invariants: the result is always within [min_replicas, max_replicas] (unless
the current count is 0: scaled to zero by the user, HPA leaves it alone);
no metric outside tolerance means no change; the returned state holds only
entries young enough to matter (spec.history_seconds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pagedinfer.contracts import validators
from pagedinfer.operator.autoscaling.spec import (
    KV_CACHE_USAGE,
    PREFIX_CACHE_HIT_RATE,
    AutoscalingSpec,
    MetricTarget,
    ScalingRules,
)

# Ratios are rounded before `ceil` and the tolerance test so that
# 0.84 / 0.7 * 5 = 6.000000000000001 recommends 6 pods, not 7, and a ratio of
# 0.7 / 1.0 sits within a tolerance of 0.3.
_RATIO_DECIMALS = 9


@dataclass(frozen=True)
class MetricSample:
    """One metric aggregated over the ready pods that reported it.

    `value` is None when no pod reported it. For `prefixCacheHitRate` the value
    is the token-weighted hit rate over the interval and a pod with zero query
    tokens does not count as reporting."""

    value: float | None
    num_pods_with_data: int

    def __post_init__(self) -> None:
        validators.non_negative_int("num_pods_with_data", self.num_pods_with_data)
        if self.value is None and self.num_pods_with_data:
            raise ValueError("value must be set when num_pods_with_data > 0")
        if self.value is not None and (not math.isfinite(self.value) or self.value < 0):
            raise ValueError(f"value must be a finite number >= 0, got {self.value!r}")
        if self.value is not None and self.num_pods_with_data == 0:
            raise ValueError("num_pods_with_data must be > 0 when value is set")


@dataclass(frozen=True)
class Observation:
    """What one autoscaling interval saw.

    `current_replicas` is spec.replicas now; `num_ready_pods` the ready pods
    that were scraped (their number is the base of every ratio);
    `num_failed_scrapes` how many of those could not be read."""

    current_replicas: int
    num_ready_pods: int
    num_failed_scrapes: int
    metrics: Mapping[str, MetricSample]

    def __post_init__(self) -> None:
        validators.non_negative_int("current_replicas", self.current_replicas)
        validators.non_negative_int("num_ready_pods", self.num_ready_pods)
        if not 0 <= self.num_failed_scrapes <= self.num_ready_pods:
            raise ValueError(f"num_failed_scrapes must be in [0, num_ready_pods], got {self.num_failed_scrapes}")
        for name, sample in self.metrics.items():
            if sample.num_pods_with_data > self.num_ready_pods:
                raise ValueError(f"metrics[{name}].num_pods_with_data exceeds num_ready_pods")

    @property
    def num_unready_pods(self) -> int:
        return max(0, self.current_replicas - self.num_ready_pods)


@dataclass(frozen=True)
class TimedReplicas:
    """A replica count (or signed change) at a time in seconds."""

    time_seconds: float
    replicas: int


@dataclass(frozen=True)
class AutoscalerState:
    """History carried between decisions: raw recommendations (stabilization)
    and applied scale events as signed replica changes (rate limits)."""

    recommendations: tuple[TimedReplicas, ...] = ()
    scale_events: tuple[TimedReplicas, ...] = ()
    seeded: bool = False  # the history was started (with the count found at the first decision)


# Why a metric recommends what it does.
SCALE = "scale"
WITHIN_TOLERANCE = "within-tolerance"
NO_TRAFFIC = "no-traffic"
UNAVAILABLE = "unavailable"
REVERSED = "reversed-by-missing-pods"
NO_KV_PRESSURE = "no-kv-pressure"  # the hit rate abstains: kvCacheUsage does not ask for more replicas


@dataclass(frozen=True)
class MetricRecommendation:
    """One metric's vote. `replicas` is None when it abstains (NO_TRAFFIC,
    NO_KV_PRESSURE) or has no data (UNAVAILABLE); `usage_ratio` > 1 means too
    few replicas. `replicas` is ceil(ratio x pods) unbounded by
    min/maxReplicas (an infinite ratio, a hit rate of 0, gives maxReplicas)."""

    name: str
    value: float | None
    target: float
    usage_ratio: float | None
    replicas: int | None
    status: str


@dataclass(frozen=True)
class ScalingDecision:
    """The outcome of one interval. `recommended_replicas` is the raw metric
    recommendation before stabilization and rate limits (None when holding)."""

    current_replicas: int
    desired_replicas: int
    recommended_replicas: int | None
    metrics: tuple[MetricRecommendation, ...]
    reason: str
    state: AutoscalerState = field(repr=False)

    @property
    def changed(self) -> bool:
        return self.desired_replicas != self.current_replicas


def decide(
    spec: AutoscalingSpec, observation: Observation, state: AutoscalerState, now_seconds: float
) -> ScalingDecision:
    """One autoscaling step (see the module docstring). Pure: the caller stores
    `decision.state` once the new replica count has been applied."""
    current = observation.current_replicas
    state = _prune(state, now_seconds - spec.history_seconds)
    votes = _gate_hit_rate(tuple(_recommend(m, observation, spec) for m in spec.metrics), current)

    if current == 0:
        return ScalingDecision(
            0, 0, None, votes, "replicas is 0 (scaled to zero by the user): autoscaling holds", state
        )
    if current > spec.max_replicas or current < spec.min_replicas:
        desired = min(max(current, spec.min_replicas), spec.max_replicas)
        bound = "maxReplicas" if current > spec.max_replicas else "minReplicas"
        reason = f"replicas {current} outside [{spec.min_replicas}, {spec.max_replicas}]: set to {bound} {desired}"
        return ScalingDecision(
            current, desired, None, votes, reason, _record_event(state, now_seconds, desired - current)
        )

    recommended, winner, hold_reason = _combine(votes, current)
    if recommended is None or winner is None:
        return ScalingDecision(current, current, None, votes, hold_reason, state)
    bound_note = _bound_note(spec, winner, recommended)
    recommended = min(max(recommended, spec.min_replicas), spec.max_replicas)

    if not state.seeded and spec.scale_down.stabilization_window_seconds > 0:
        state = AutoscalerState((TimedReplicas(now_seconds, current),), state.scale_events, True)
    stabilized = _stabilize(spec, state, recommended, current, now_seconds)
    state = AutoscalerState(
        state.recommendations + (TimedReplicas(now_seconds, recommended),), state.scale_events, True
    )
    limited, limit_note = _rate_limit(spec, state, stabilized, current, now_seconds)
    desired = min(max(limited, spec.min_replicas), spec.max_replicas)
    if desired != current:
        state = _record_event(state, now_seconds, desired - current)
    reason = _explain(winner, current, recommended, stabilized, desired, limit_note, bound_note, spec)
    return ScalingDecision(current, desired, recommended, votes, reason, state)


def usage_ratio(metric: MetricTarget, value: float) -> float:
    """value / target, or target / value for an inverted metric (inf at 0)."""
    if metric.inverted:
        return math.inf if value == 0 else metric.target / value
    return value / metric.target


def _recommend(metric: MetricTarget, obs: Observation, spec: AutoscalingSpec) -> MetricRecommendation:
    sample = obs.metrics.get(metric.name)
    current = obs.current_replicas
    if sample is None or sample.value is None:
        failed = obs.num_failed_scrapes > 0 or obs.num_ready_pods == 0
        status = UNAVAILABLE if failed or metric.name != PREFIX_CACHE_HIT_RATE else NO_TRAFFIC
        return MetricRecommendation(metric.name, None, metric.target, None, None, status)

    def vote(ratio: float, replicas: int, status: str) -> MetricRecommendation:
        return MetricRecommendation(metric.name, sample.value, metric.target, ratio, replicas, status)

    tolerance = spec.tolerance
    ratio = usage_ratio(metric, sample.value)
    num_missing = obs.num_ready_pods - sample.num_pods_with_data
    scale_up_with_unready = obs.num_unready_pods > 0 and ratio > 1
    if not scale_up_with_unready and num_missing == 0:
        if _within(ratio, tolerance):
            return vote(ratio, current, WITHIN_TOLERANCE)
        return vote(ratio, _ceil_pods(ratio, sample.num_pods_with_data, spec.max_replicas), SCALE)

    total, num_pods = ratio * sample.num_pods_with_data, sample.num_pods_with_data
    if num_missing:
        total += (1.0 if ratio < 1 else 0.0) * num_missing
        num_pods += num_missing
    if scale_up_with_unready:
        num_pods += obs.num_unready_pods
    new_ratio = total / num_pods if math.isfinite(total) else math.inf
    if _within(new_ratio, tolerance):
        return vote(new_ratio, current, WITHIN_TOLERANCE)
    if (ratio < 1 < new_ratio) or (ratio > 1 > new_ratio):
        return vote(new_ratio, current, REVERSED)
    replicas = _ceil_pods(new_ratio, num_pods, spec.max_replicas)
    if (new_ratio < 1 and replicas > current) or (new_ratio > 1 and replicas < current):
        return vote(new_ratio, current, REVERSED)
    return vote(new_ratio, replicas, SCALE)


def _within(ratio: float, tolerance: float) -> bool:
    return round(abs(ratio - 1), _RATIO_DECIMALS) <= tolerance


def _ceil_pods(ratio: float, num_pods: int, max_replicas: int) -> int:
    """ceil(ratio x num_pods); max_replicas when that is infinite (a hit rate of 0,
    or one so small the product overflows). Unbounded otherwise: decide()
    clamps, and says so when the clamp bound the result."""
    pods = round(ratio * num_pods, _RATIO_DECIMALS)
    return math.ceil(pods) if math.isfinite(pods) else max_replicas


def _gate_hit_rate(votes: tuple[MetricRecommendation, ...], current: int) -> tuple[MetricRecommendation, ...]:
    """The hit rate keeps its vote only while kvCacheUsage asks for more than
    `current` replicas (the module docstring says why); else it abstains."""
    kv = next((v for v in votes if v.name == KV_CACHE_USAGE), None)
    under_pressure = kv is not None and kv.replicas is not None and kv.replicas > current
    return tuple(
        replace(v, replicas=None, status=NO_KV_PRESSURE)
        if v.name == PREFIX_CACHE_HIT_RATE and v.replicas is not None and not under_pressure
        else v
        for v in votes
    )


def _combine(
    votes: tuple[MetricRecommendation, ...], current: int
) -> tuple[int | None, MetricRecommendation | None, str]:
    """Largest recommendation wins; an unavailable metric vetoes anything but a scale up."""
    voting = [v for v in votes if v.replicas is not None]
    unavailable = [v.name for v in votes if v.status == UNAVAILABLE]
    if not voting:
        if unavailable:
            return None, None, f"holding: no data for {', '.join(unavailable)}"
        return None, None, "holding: no traffic in the interval"
    winner = max(voting, key=_asked)
    if unavailable and winner.replicas <= current:
        return None, winner, f"holding: no data for {', '.join(unavailable)} (never scale down on partial metrics)"
    return winner.replicas, winner, ""


def _asked(vote: MetricRecommendation) -> float:
    """How many replicas a vote asks for; an infinite ratio (a hit rate of 0) asks
    for more than any finite count, though its `replicas` reads maxReplicas."""
    if vote.usage_ratio is not None and not math.isfinite(vote.usage_ratio):
        return math.inf
    return float(vote.replicas or 0)


def _stabilize(spec: AutoscalingSpec, state: AutoscalerState, recommended: int, current: int, now: float) -> int:
    """HPA's stabilizeRecommendationWithBehaviors: up to the lowest recommendation
    in the scale-up window, down to the highest in the scale-down window."""
    up_cutoff = now - spec.scale_up.stabilization_window_seconds
    down_cutoff = now - spec.scale_down.stabilization_window_seconds
    up, down = recommended, recommended
    for rec in state.recommendations:
        if rec.time_seconds > up_cutoff:
            up = min(up, rec.replicas)
        if rec.time_seconds > down_cutoff:
            down = max(down, rec.replicas)
    return min(max(current, up), down)


def _rate_limit(
    spec: AutoscalingSpec, state: AutoscalerState, desired: int, current: int, now: float
) -> tuple[int, str]:
    if desired > current:
        limit = _scale_limit(spec.scale_up, state, current, now, up=True)
        if desired > limit:
            return limit, f"limited to {limit} by scaleUp policies"
    elif desired < current:
        limit = _scale_limit(spec.scale_down, state, current, now, up=False)
        if desired < limit:
            return limit, f"limited to {limit} by scaleDown policies"
    return desired, ""


def _scale_limit(rules: ScalingRules, state: AutoscalerState, current: int, now: float, up: bool) -> int:
    """The furthest count reachable now: per policy, from the count at the start
    of its period (current minus the changes made within it)."""
    if rules.select_policy == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        cutoff = now - policy.period_seconds
        changed = sum(e.replicas for e in state.scale_events if e.time_seconds > cutoff and (e.replicas > 0) == up)
        start = current - changed
        if policy.type == "Pods":
            proposals.append(start + policy.value if up else start - policy.value)
        elif up:
            proposals.append(-(-start * (100 + policy.value) // 100))
        else:
            proposals.append(start * (100 - policy.value) // 100)
    pick = max if (rules.select_policy == "Max") == up else min
    limit = pick(proposals)
    return max(limit, current) if up else min(limit, current)


def _record_event(state: AutoscalerState, now: float, change: int) -> AutoscalerState:
    return AutoscalerState(state.recommendations, state.scale_events + (TimedReplicas(now, change),), state.seeded)


def _prune(state: AutoscalerState, cutoff: float) -> AutoscalerState:
    return AutoscalerState(
        tuple(r for r in state.recommendations if r.time_seconds > cutoff),
        tuple(e for e in state.scale_events if e.time_seconds > cutoff),
        state.seeded,
    )


def _bound_note(spec: AutoscalingSpec, winner: MetricRecommendation, recommended: int) -> str:
    """What minReplicas/maxReplicas did to the winning recommendation, in words ("" if nothing)."""
    if recommended < spec.min_replicas:
        return f"raised to minReplicas {spec.min_replicas}"
    asks_all = winner.usage_ratio is not None and not math.isfinite(winner.usage_ratio)
    if recommended > spec.max_replicas or asks_all:
        return f"capped at maxReplicas {spec.max_replicas}"
    return ""


def _explain(
    winner: MetricRecommendation,
    current: int,
    recommended: int,
    stabilized: int,
    desired: int,
    limit_note: str,
    bound_note: str,
    spec: AutoscalingSpec,
) -> str:
    """The reason in words: which metric, its value against the target, and what
    held it back: a bound, a stabilization window or a rate limit. Never
    "N replicas is right" when a bound or a limit decided N."""
    side = "below" if winner.value is not None and winner.value < winner.target else "above"
    if winner.status == WITHIN_TOLERANCE:
        side = "within tolerance of"
    what = f"{winner.name} {_fmt(winner.value)} {side} target {_fmt(winner.target)}"
    if winner.status == REVERSED:
        what += " (unready or unscraped pods counted conservatively)"
    asked = winner.replicas
    if asked is not None and winner.usage_ratio is not None and not math.isfinite(winner.usage_ratio):
        asked_words = "as many replicas as allowed"
    else:
        asked_words = f"{asked} replicas"
    if desired == current:
        if recommended == current:
            if bound_note:
                return f"{what} recommends {asked_words}; {bound_note}: holding {current}"
            return f"{what}: {current} replicas is right"
        rec = f"{what} recommends {recommended} replicas" + (f" ({bound_note})" if bound_note else "")
        if stabilized == current:
            window = spec.scale_down if recommended < current else spec.scale_up
            direction = "scaleDown" if recommended < current else "scaleUp"
            return (
                f"{rec}; holding {current} within the "
                f"{direction} stabilization window ({window.stabilization_window_seconds:g} s)"
            )
        return f"{rec}; {limit_note}: holding {current}"
    notes = [f"recommended {asked_words}" if bound_note else f"recommended {recommended}"]
    if bound_note:
        notes.append(bound_note)
    if limit_note:
        notes.append(limit_note)
    elif stabilized != recommended:
        notes.append(f"stabilization window keeps {stabilized}")
    note = f" ({'; '.join(notes)})" if len(notes) > 1 else ""
    return f"{what}: {current} -> {desired} replicas{note}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"
