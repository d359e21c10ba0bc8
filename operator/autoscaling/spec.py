"""`spec.autoscaling` of an InferenceService, parsed into frozen dataclasses.

The shape follows the Kubernetes HorizontalPodAutoscaler (autoscaling/v2):
`spec.minReplicas`/`spec.maxReplicas` bound the decision, `metrics` lists per-metric
targets, and `scaleUp`/`scaleDown` mirror `spec.behavior.scaleUp/scaleDown`
(`stabilizationWindowSeconds`, `policies` of `{type: Pods|Percent, value,
periodSeconds}`, `selectPolicy` Max|Min|Disabled). Defaults are HPA's
(https://kubernetes.io/docs/concepts/workloads/autoscaling/horizontal-pod-autoscale/#default-behavior):
scale up with no stabilization by at most max(4 pods, 100%) per 15 s; scale
down after a 300 s stabilization window by at most 100% per 15 s.

Metric names and their direction:
- `kvCacheUsage`: fraction of the KV block pool in use, averaged over ready
  pods; ABOVE target scales up. Target in (0, 1].
- `prefixCacheHitRate`: prefix-cache hit tokens / query tokens over the last
  interval; BELOW target scales up, but only while `kvCacheUsage` asks for
  more replicas too (a full pool evicts cached prefixes; behind a plain
  Service more replicas alone spread each prefix over more caches and LOWER
  the hit rate: autoscaling_policy explains). So it needs `kvCacheUsage`
  listed as well, and `spec.engine.enablePrefixCaching` (the default): with
  prefix caching off the engine never hits, its hit rate is always 0, and
  that would vote for maxReplicas whenever KV usage is above its target
  (`prefix_caching_conflict`, also a check of `spec_parser`, so the spec is
  Valid=False, and a CEL rule). Target in (0, 1].
- `requestsWaiting`: average waiting requests per ready pod (the engine's
  `pagedinfer_num_requests_waiting`: a prompt's n completions are one
  request); above target scales up. Target > 0.

Scale to zero (docs/autoscaling.md, "Scale to zero"): `spec.minReplicas: 0`,
written out, with autoscaling enabled turns on the idle rule `idle`
(`{afterSeconds: N}`, default 300 s, KEDA's cooldownPeriod): after N seconds
with no request running or waiting at any engine and none queued at the
router, the service goes to zero replicas, or to `standby` replicas kept
asleep (the engines' POST /sleep). Nothing but the router can hold a
request while no engine runs, so `minReplicas: 0` needs the router on
(`idle_spec.scale_to_zero_conflict`). The metric rules above never go below
max(1, standby): only the idle rule (autoscaling.idle) goes lower.

Every constructor validates and raises ValueError naming the offending field
(dotted path under `spec.autoscaling`). `parse_autoscaling_spec` reads the
whole of `spec.autoscaling` and raises AutoscalingSpecError listing every
problem at once; `spec_parser.parse_spec` calls it, so a spec the autoscaler
would refuse is Valid=False InvalidSpec, and the autoscaler's daemon calls it
too: both apply the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedinfer.operator.autoscaling.idle_spec import IdleRule, parse_idle, scale_to_zero_conflict, standby_problems

KV_CACHE_USAGE = "kvCacheUsage"
PREFIX_CACHE_HIT_RATE = "prefixCacheHitRate"
REQUESTS_WAITING = "requestsWaiting"
METRIC_NAMES = (KV_CACHE_USAGE, PREFIX_CACHE_HIT_RATE, REQUESTS_WAITING)
# Metrics whose value below target means too few replicas.
INVERTED_METRICS = frozenset({PREFIX_CACHE_HIT_RATE})
FRACTION_METRICS = frozenset({KV_CACHE_USAGE, PREFIX_CACHE_HIT_RATE})

POLICY_TYPES = ("Pods", "Percent")
SELECT_POLICIES = ("Max", "Min", "Disabled")
SOURCE_TYPES = ("direct", "prometheus")
MAX_WINDOW_SECONDS = 3600


class AutoscalingSpecError(ValueError):
    """Every problem found in `spec.autoscaling` (and the bounds it reads), each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class MetricTarget:
    """One entry of `metrics`: which engine metric, and the value to hold it at."""

    name: str
    target: float

    def __post_init__(self) -> None:
        if self.name not in METRIC_NAMES:
            raise ValueError(f"metrics[].name must be one of {', '.join(METRIC_NAMES)}, got {self.name!r}")
        if not _is_finite_number(self.target) or self.target <= 0:
            raise ValueError(f"metrics[{self.name}].target must be a positive number, got {self.target!r}")
        if self.name in FRACTION_METRICS and self.target > 1:
            raise ValueError(f"metrics[{self.name}].target is a fraction and must be <= 1, got {self.target!r}")

    @property
    def inverted(self) -> bool:
        """True when a value below target asks for more replicas."""
        return self.name in INVERTED_METRICS


@dataclass(frozen=True)
class ScalingPolicy:
    """At most `value` pods (or `value` percent of the replicas at the start of the
    period) added or removed within any `period_seconds`."""

    type: str
    value: int
    period_seconds: int

    def __post_init__(self) -> None:
        if self.type not in POLICY_TYPES:
            raise ValueError(f"policies[].type must be Pods or Percent, got {self.type!r}")
        if not _is_int(self.value) or self.value <= 0:
            raise ValueError(f"policies[].value must be a positive integer, got {self.value!r}")
        if not _is_int(self.period_seconds) or not 0 < self.period_seconds <= 1800:
            raise ValueError(f"policies[].periodSeconds must be an integer in (0, 1800], got {self.period_seconds!r}")


@dataclass(frozen=True)
class ScalingRules:
    """One direction's behaviour (HPA's HPAScalingRules)."""

    stabilization_window_seconds: float
    policies: tuple[ScalingPolicy, ...]
    select_policy: str = "Max"

    def __post_init__(self) -> None:
        problems = []
        w = self.stabilization_window_seconds
        if not _is_finite_number(w) or not 0 <= w <= MAX_WINDOW_SECONDS:
            problems.append(f"stabilizationWindowSeconds must be in [0, {MAX_WINDOW_SECONDS}], got {w!r}")
        if not self.policies:
            problems.append("policies must list at least one policy")
        if self.select_policy not in SELECT_POLICIES:
            problems.append(f"selectPolicy must be one of {', '.join(SELECT_POLICIES)}, got {self.select_policy!r}")
        if problems:
            raise AutoscalingSpecError(problems)

    @property
    def longest_period_seconds(self) -> int:
        return max(p.period_seconds for p in self.policies)


DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),))


@dataclass(frozen=True)
class MetricsSource:
    """Where metrics come from: each ready pod's /metrics, or a Prometheus server."""

    type: str = "direct"
    url: str | None = None

    def __post_init__(self) -> None:
        if self.type not in SOURCE_TYPES:
            raise ValueError(f"source.type must be direct or prometheus, got {self.type!r}")
        if self.type == "prometheus":
            if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
                raise ValueError(f"source.url must be an http(s) URL when source.type is prometheus, got {self.url!r}")


@dataclass(frozen=True)
class AutoscalingSpec:
    """The validated `spec.autoscaling`. Invariant: 1 <= min_replicas <= max_replicas, where
    min_replicas is the metric rules' floor, max(1, spec.minReplicas, standby); `idle` is set
    exactly when the service scales to zero (spec.minReplicas: 0 written out, autoscaling on),
    and 0 <= standby <= max_replicas."""

    enabled: bool
    min_replicas: int
    max_replicas: int
    metrics: tuple[MetricTarget, ...]
    interval_seconds: float = 15.0
    tolerance: float = 0.1
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    source: MetricsSource = MetricsSource()
    scrape_timeout_seconds: float = 5.0
    scrape_concurrency: int = 8
    idle: IdleRule | None = None  # None: the service never goes below min_replicas
    standby: int = 0  # replicas kept asleep instead of zero (idle rule only)

    def __post_init__(self) -> None:
        if problems := self.problems():
            raise AutoscalingSpecError(problems)

    def problems(self) -> list[str]:
        """Every rule of the top-level fields this spec breaks (the parts check themselves)."""
        out = []
        if not isinstance(self.enabled, bool):
            out.append(f"spec.autoscaling.enabled must be a boolean, got {self.enabled!r}")
        if not _is_int(self.min_replicas) or self.min_replicas < 1:
            out.append(f"minReplicas must be an integer >= 1, got {self.min_replicas!r}")
        elif not _is_int(self.max_replicas) or self.max_replicas < self.min_replicas:
            out.append(
                f"maxReplicas must be an integer >= minReplicas ({self.min_replicas}), got {self.max_replicas!r}"
            )
        if self.enabled is True and not self.metrics:
            out.append("spec.autoscaling.metrics must list at least one metric when enabled")
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            out.append(f"spec.autoscaling.metrics lists a metric twice: {names}")
        if PREFIX_CACHE_HIT_RATE in names and KV_CACHE_USAGE not in names:
            out.append(
                f"spec.autoscaling.metrics: {PREFIX_CACHE_HIT_RATE} needs {KV_CACHE_USAGE} listed too"
                " (a low hit rate scales up only while KV usage is above its target)"
            )
        if not _is_finite_number(self.interval_seconds) or self.interval_seconds <= 0:
            out.append(f"spec.autoscaling.intervalSeconds must be positive, got {self.interval_seconds!r}")
        if not _is_finite_number(self.tolerance) or not 0 <= self.tolerance < 1:
            out.append(f"spec.autoscaling.tolerance must be in [0, 1), got {self.tolerance!r}")
        t = self.scrape_timeout_seconds
        if not _is_finite_number(t) or t <= 0:
            out.append(f"spec.autoscaling.scrapeTimeoutSeconds must be positive, got {t!r}")
        if not _is_int(self.scrape_concurrency) or self.scrape_concurrency < 1:
            out.append(f"spec.autoscaling.scrapeConcurrency must be an integer >= 1, got {self.scrape_concurrency!r}")
        if not _is_int(self.standby) or self.standby < 0:
            out.append(f"spec.autoscaling.standby must be an integer >= 0, got {self.standby!r}")
        elif _is_int(self.max_replicas) and self.standby > self.max_replicas:
            out.append(f"spec.autoscaling.standby must be <= maxReplicas ({self.max_replicas}), got {self.standby}")
        return out

    @property
    def scale_to_zero(self) -> bool:
        """Whether the idle rule may take the service below min_replicas (to 0 or to standby asleep)."""
        return self.idle is not None

    @property
    def history_seconds(self) -> float:
        """How far back decisions look: the longest stabilization window or policy period."""
        return max(
            self.scale_up.stabilization_window_seconds,
            self.scale_down.stabilization_window_seconds,
            self.scale_up.longest_period_seconds,
            self.scale_down.longest_period_seconds,
        )


def prefix_caching_conflict(spec: Mapping[str, Any]) -> str | None:
    """Why a raw InferenceService `spec` cannot scale on the prefix-cache hit rate, or None when it can.

    It cannot when `autoscaling.metrics` lists prefixCacheHitRate and
    `engine.enablePrefixCaching` is false (enabled or not: `metrics` says
    what autoscaling would use). Malformed parts are left to their own checks.
    """
    autoscaling, engine = spec.get("autoscaling"), spec.get("engine")
    metrics = autoscaling.get("metrics") if isinstance(autoscaling, Mapping) else None
    listed = isinstance(metrics, list) and any(
        isinstance(m, Mapping) and m.get("name") == PREFIX_CACHE_HIT_RATE for m in metrics
    )
    if listed and isinstance(engine, Mapping) and engine.get("enablePrefixCaching") is False:
        return (
            f"{PREFIX_CACHE_HIT_RATE} needs spec.engine.enablePrefixCaching: true, which is false: the engine"
            " then never hits, its hit rate stays 0, and the autoscaler would take that for a thrashing cache"
            f" and scale towards maxReplicas whenever {KV_CACHE_USAGE} is above its target"
        )
    return None


def parse_autoscaling_spec(spec: Mapping[str, Any], *, bounds_checked: bool = False) -> AutoscalingSpec:
    """Build an AutoscalingSpec from an InferenceService `spec` (camelCase keys).

    Reads `spec.autoscaling` and the bounds `spec.minReplicas` /
    `spec.maxReplicas` (shared with the reconciler, which clamps
    `spec.replicas` into them). A ratio cannot grow zero replicas, so the
    metric rules' floor is max(1, minReplicas, standby); only the idle rule
    goes below it, and only with `minReplicas: 0` written out (a missing
    minReplicas also reads 0, but never turns scale to zero on); `maxReplicas`
    is required once autoscaling is enabled (as it is on an HPA). No `autoscaling`, or one
    without `enabled: true`, gives a disabled spec. Raises
    AutoscalingSpecError listing every wrong type or value, each naming its
    field. `bounds_checked`: the caller (spec_parser) reports bad
    minReplicas/maxReplicas itself, so they are not listed again.
    """
    if not isinstance(spec, Mapping):
        raise AutoscalingSpecError([f"spec must be an object, got {type(spec).__name__}"])
    problems: list[str] = []
    bound_problems: list[str] = []
    raw = spec.get("autoscaling")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise AutoscalingSpecError([f"spec.autoscaling must be an object, got {type(raw).__name__}"])
    enabled = raw.get("enabled", False)
    min_replicas = spec.get("minReplicas", 0)
    if not _is_int(min_replicas) or min_replicas < 0:
        bound_problems.append(f"spec.minReplicas must be an integer >= 0, got {min_replicas!r}")
        min_replicas = 0
    zero_written = _is_int(spec.get("minReplicas")) and spec.get("minReplicas") == 0
    if (conflict := scale_to_zero_conflict(spec)) is not None:
        problems.append(conflict)
    idle = _collect(problems, lambda: parse_idle(raw.get("idle"), zero_written))
    standby = raw.get("standby", 0)
    problems += standby_problems(spec, standby, zero_written)
    min_replicas = max(1, min_replicas)
    max_replicas = spec.get("maxReplicas")
    if max_replicas is None:
        if enabled is True:
            problems.append("spec.maxReplicas is required when spec.autoscaling.enabled is true")
        max_replicas = min_replicas
    elif not _is_int(max_replicas) or max_replicas < min_replicas:
        bound_problems.append(f"spec.maxReplicas must be an integer >= max(1, minReplicas), got {max_replicas!r}")
        max_replicas = min_replicas
    if not bounds_checked:
        problems = bound_problems + problems
    if _is_int(standby) and min_replicas < standby <= max_replicas:  # a standby above max is reported below
        min_replicas = standby
    metrics_raw = raw.get("metrics", [])
    metrics: list[MetricTarget] = []
    if not isinstance(metrics_raw, list):
        problems.append("spec.autoscaling.metrics must be a list")
        metrics_raw = []
    for i, m in enumerate(metrics_raw):
        _collect(problems, lambda: metrics.append(_metric(i, m)))
    if (conflict := prefix_caching_conflict(spec)) is not None:
        problems.append(f"spec.autoscaling.metrics: {conflict}")
    source_raw = raw.get("source") or {}
    source = MetricsSource()
    if not isinstance(source_raw, Mapping):
        problems.append("spec.autoscaling.source must be an object")
    else:
        source = _collect(
            problems, lambda: MetricsSource(type=source_raw.get("type", "direct"), url=source_raw.get("url")), source
        )
    scale_up = _collect(problems, lambda: _rules("scaleUp", raw.get("scaleUp"), DEFAULT_SCALE_UP), DEFAULT_SCALE_UP)
    scale_down = _collect(
        problems, lambda: _rules("scaleDown", raw.get("scaleDown"), DEFAULT_SCALE_DOWN), DEFAULT_SCALE_DOWN
    )
    parsed = _collect(
        problems,
        lambda: AutoscalingSpec(
            # with a metric already reported bad, "enabled needs a metric" would only repeat it
            enabled=False if enabled is True and len(metrics) < len(metrics_raw) else enabled,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            metrics=tuple(metrics),
            interval_seconds=raw.get("intervalSeconds", 15),
            tolerance=raw.get("tolerance", 0.1),
            scale_up=scale_up,
            scale_down=scale_down,
            source=source,
            scrape_timeout_seconds=raw.get("scrapeTimeoutSeconds", 5),
            scrape_concurrency=raw.get("scrapeConcurrency", 8),
            idle=idle if zero_written and enabled is True else None,
            standby=standby,
        ),
    )
    if problems:
        raise AutoscalingSpecError(problems)
    return parsed


def _collect(problems: list[str], build: Any, fallback: Any = None) -> Any:
    """build(), or `fallback` with its ValueError's problems appended to `problems`."""
    try:
        return build()
    except AutoscalingSpecError as e:
        problems.extend(e.problems)
    except ValueError as e:
        problems.append(str(e))
    return fallback


def _metric(index: int, raw: Any) -> MetricTarget:
    if not isinstance(raw, Mapping) or "name" not in raw or "target" not in raw:
        raise ValueError(f"spec.autoscaling.metrics[{index}] must be an object with name and target")
    try:
        return MetricTarget(name=raw["name"], target=raw["target"])
    except ValueError as e:
        raise ValueError(f"spec.autoscaling.metrics[{index}]: {e}") from None


def _rules(field: str, raw: Any, default: ScalingRules) -> ScalingRules:
    """One direction's rules; AutoscalingSpecError lists every bad policy and setting."""
    if raw is None:
        return default
    if not isinstance(raw, Mapping):
        raise ValueError(f"spec.autoscaling.{field} must be an object")
    problems: list[str] = []
    policies_raw = raw.get("policies")
    policies = default.policies
    if policies_raw is not None:
        if not isinstance(policies_raw, list) or not all(isinstance(p, Mapping) for p in policies_raw):
            problems.append("policies must be a list of {type, value, periodSeconds}")
        else:
            built = [
                _collect(problems, lambda p=p: ScalingPolicy(p.get("type"), p.get("value"), p.get("periodSeconds")))
                for p in policies_raw
            ]
            # a list that had only bad entries is reported as such, not also as empty
            policies = tuple(p for p in built if p is not None) or (default.policies if problems else ())
    rules = _collect(
        problems,
        lambda: ScalingRules(
            stabilization_window_seconds=raw.get("stabilizationWindowSeconds", default.stabilization_window_seconds),
            policies=policies,
            select_policy=raw.get("selectPolicy", "Max"),
        ),
    )
    if problems:
        raise AutoscalingSpecError([f"spec.autoscaling.{field}.{p}" for p in problems])
    return rules
