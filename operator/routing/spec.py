"""`spec.router` of an InferenceService, validated (pure).

    router:
      enabled: true          # default: on when spec.maxReplicas > 1, else off; explicit true/false wins
      replicas: 2            # router pods (1..16)
      policy: prefix         # prefix | least-load | round-robin (contracts/routing/policies.py)
      image: ...             # default: the operator's --router-image
      resources: {requests: {cpu: 500m, memory: 512Mi}, limits: {memory: 1Gi}}
      queue: {maxRequests: 256, timeoutSeconds: 120}  # the hold queue while no engine is ready; unset: the router's defaults
      warmup: {prefixes: 8, tokenBudget: 32768}  # hot prefixes replayed to new engines and on scale-in (warmup_spec.py)

`parse_router_spec` returns every problem at once, each prefixed by its dotted
path (spec.parser adds them to the spec's others, so a bad router spec is
Valid=False InvalidSpec like any other field).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagedinfer.contracts.routing.policies import POLICIES
from pagedinfer.operator.routing.warmup_spec import RouterWarmup, parse_warmup
from pagedinfer.operator.spec.quantity import QUANTITY_PATTERN

PATH = "spec.router"
DEFAULT_REPLICAS = 2
MAX_REPLICAS = 16
DEFAULT_POLICY = "prefix"
RESOURCE_NAMES = ("cpu", "memory")
# Enough for the tokenizer of a large vocabulary and a few hundred requests in flight.
DEFAULT_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "1Gi"},
}
_IMAGE = re.compile(r"[^\s]+")


@dataclass(frozen=True)
class RouterQueue:
    """`spec.router.queue`: the router's hold queue (requests kept while no engine can take them).
    None for a field: the router's own default (router/cli.py), so the flag is not passed."""

    max_requests: int | None = None
    timeout_seconds: float | None = None


class RouterSpecError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class RouterSpec:
    """The validated `spec.router`. `enabled` is resolved (its default applied)."""

    enabled: bool = False
    replicas: int = DEFAULT_REPLICAS
    policy: str = DEFAULT_POLICY
    image: str | None = None  # None: the operator's router image (OperatorConfig.router_image)
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: DEFAULT_RESOURCES)
    queue: RouterQueue = RouterQueue()
    warmup: RouterWarmup = RouterWarmup()


def default_enabled(max_replicas: int | None) -> bool:
    """The router is on by default exactly when the engines can be more than one (spec.maxReplicas > 1)."""
    return max_replicas is not None and max_replicas > 1


def _resources(raw: Any, problems: list[str]) -> Mapping[str, Mapping[str, str]]:
    path = f"{PATH}.resources"
    if raw is None:
        return DEFAULT_RESOURCES
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be an object with requests and/or limits, got {type(raw).__name__}")
        return DEFAULT_RESOURCES
    out: dict[str, dict[str, str]] = {}
    for key, values in raw.items():
        if key not in ("requests", "limits"):
            problems.append(f"{path}.{key}: unknown field (requests, limits)")
            continue
        if not isinstance(values, Mapping):
            problems.append(f"{path}.{key}: must be an object")
            continue
        for name, quantity in values.items():
            if name not in RESOURCE_NAMES:
                problems.append(f"{path}.{key}.{name}: the router takes only {', '.join(RESOURCE_NAMES)}")
            elif not isinstance(quantity, str) or not QUANTITY_PATTERN.fullmatch(quantity):
                problems.append(
                    f"{path}.{key}.{name}: must be a Kubernetes quantity such as 500m or 1Gi, got {quantity!r}"
                )
            else:
                out.setdefault(key, {})[name] = quantity
    return out


def _queue(raw: Any, problems: list[str]) -> RouterQueue:
    path = f"{PATH}.queue"
    if raw is None:
        return RouterQueue()
    if not isinstance(raw, Mapping):
        problems.append(f"{path}: must be an object {{maxRequests, timeoutSeconds}}, got {type(raw).__name__}")
        return RouterQueue()
    unknown = sorted(set(raw) - {"maxRequests", "timeoutSeconds"})
    if unknown:
        problems.append(f"{path}: unknown field(s) {', '.join(unknown)}")
    limit = raw.get("maxRequests")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        problems.append(
            f"{path}.maxRequests: must be an integer >= 1 (0 would refuse every request while no"
            f" engine is ready), got {limit!r}"
        )
        limit = None
    timeout = raw.get("timeoutSeconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0
    ):
        problems.append(f"{path}.timeoutSeconds: must be a number of seconds > 0, got {timeout!r}")
        timeout = None
    return RouterQueue(limit, None if timeout is None else float(timeout))


def parse_router_spec(raw: Any, max_replicas: int | None) -> RouterSpec:
    """`spec.router` (None when absent) -> RouterSpec; RouterSpecError lists every problem."""
    problems: list[str] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise RouterSpecError([f"{PATH}: must be an object, got {type(raw).__name__}"])
    enabled = raw.get("enabled", default_enabled(max_replicas))
    if not isinstance(enabled, bool):
        problems.append(f"{PATH}.enabled: must be true or false, got {enabled!r}")
    replicas = raw.get("replicas", DEFAULT_REPLICAS)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
        problems.append(f"{PATH}.replicas: must be an integer from 1 to {MAX_REPLICAS}, got {replicas!r}")
    policy = raw.get("policy", DEFAULT_POLICY)
    if policy not in POLICIES:
        problems.append(f"{PATH}.policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
    image = raw.get("image")
    if image is not None and (not isinstance(image, str) or not _IMAGE.fullmatch(image) or len(image) > 512):
        problems.append(f"{PATH}.image: must be an image reference (no spaces, at most 512 characters), got {image!r}")
    unknown = sorted(set(raw) - {"enabled", "replicas", "policy", "image", "resources", "queue", "warmup"})
    if unknown:
        problems.append(f"{PATH}: unknown field(s) {', '.join(unknown)}")
    resources = _resources(raw.get("resources"), problems)
    queue = _queue(raw.get("queue"), problems)
    warmup = parse_warmup(raw.get("warmup"), problems)
    if problems:
        raise RouterSpecError(problems)
    return RouterSpec(
        enabled=enabled, replicas=replicas, policy=policy, image=image, resources=resources, queue=queue, warmup=warmup
    )
