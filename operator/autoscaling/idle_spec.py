"""The scale-to-zero part of `spec.autoscaling`: the idle rule's window, standby, and what they need.

`autoscaling.spec.parse_autoscaling_spec` reads these (docs/autoscaling.md, "Scale to zero"):
- `idle: {afterSeconds: N}` (default 300 s, KEDA's cooldownPeriod; 1..86400): turned on by
  `spec.minReplicas: 0` written out with autoscaling enabled, refused without it;
- `standby: K`: replicas kept asleep instead of zero; needs `minReplicas: 0`, and no
  `spec.engine.apiKeySecretRef` (the engines' POST /sleep is behind their key, which the
  operator never reads); K <= maxReplicas is checked with the bounds (AutoscalingSpec);
- `minReplicas: 0` itself needs the router (`scale_to_zero_conflict`).
Each problem names its field. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedinfer.operator.routing.spec import default_enabled

DEFAULT_IDLE_SECONDS = 300  # KEDA's default cooldownPeriod
MAX_IDLE_SECONDS = 86400


def is_count(x: Any) -> bool:
    """An int that is not a bool (JSON true is no count)."""
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class IdleRule:
    """`spec.autoscaling.idle`: how long a service must be idle before it goes to zero (or to standby)."""

    after_seconds: int = DEFAULT_IDLE_SECONDS

    def __post_init__(self) -> None:
        if not is_count(self.after_seconds) or not 1 <= self.after_seconds <= MAX_IDLE_SECONDS:
            raise ValueError(
                f"spec.autoscaling.idle.afterSeconds must be an integer in [1, {MAX_IDLE_SECONDS}]"
                f" (0 would scale to zero between two requests), got {self.after_seconds!r}"
            )


def scale_to_zero_conflict(spec: Mapping[str, Any]) -> str | None:
    """Why a raw InferenceService `spec` cannot have `minReplicas: 0`, or None when it can.

    It cannot without the router (`spec.router.enabled`, default on when maxReplicas > 1): at zero
    replicas the router's hold queue is the only thing that can keep a request until an engine is
    back. Malformed parts are left to their own checks.
    """
    if spec.get("minReplicas") != 0 or isinstance(spec.get("minReplicas"), bool):
        return None
    router = spec.get("router")
    max_replicas = spec.get("maxReplicas")
    enabled = default_enabled(max_replicas if is_count(max_replicas) else None)
    if isinstance(router, Mapping) and isinstance(router.get("enabled"), bool):
        enabled = router["enabled"]
    if enabled:
        return None
    return (
        "spec.minReplicas: 0 needs the router (spec.router.enabled: true; its default is on only when"
        " maxReplicas > 1): with no engine running, nothing else could hold the requests until one is back"
    )


def standby_problems(spec: Mapping[str, Any], standby: Any, zero_written: bool) -> list[str]:
    """What a positive `standby` needs from the rest of the raw `spec` (its type and bound are checked
    with the other fields)."""
    if not is_count(standby) or standby <= 0:
        return []
    out = []
    if not zero_written:
        out.append(
            "spec.autoscaling.standby needs spec.minReplicas: 0 (standby replicas are what an idle"
            " service keeps, asleep, instead of going to zero)"
        )
    engine = spec.get("engine")
    if isinstance(engine, Mapping) and engine.get("apiKeySecretRef"):
        out.append(
            "spec.autoscaling.standby cannot be used with spec.engine.apiKeySecretRef: the engines'"
            " POST /sleep is behind their API key, and the operator holds no Secret (it may not read"
            " one); scale to zero (standby 0) needs no key"
        )
    return out


def parse_idle(raw: Any, zero_written: bool) -> IdleRule:
    """`spec.autoscaling.idle` (absent: the default window); it needs `spec.minReplicas: 0` written out."""
    if raw is None:
        return IdleRule()
    if not zero_written:
        raise ValueError(
            "spec.autoscaling.idle needs spec.minReplicas: 0 (the idle rule scales to zero, or to"
            " standby replicas asleep; with minReplicas >= 1 the service never idles below it)"
        )
    if not isinstance(raw, Mapping):
        raise ValueError(f"spec.autoscaling.idle must be an object {{afterSeconds: N}}, got {type(raw).__name__}")
    return IdleRule(after_seconds=raw.get("afterSeconds", DEFAULT_IDLE_SECONDS))
