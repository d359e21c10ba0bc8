"""`spec.router.warmup` of an InferenceService, validated (pure), and the router flags it becomes.

    router:
      warmup: {prefixes: 8, tokenBudget: 32768}   # the defaults (contracts/routing/warmup.py); prefixes 0: off

The router replays its K = `prefixes` hottest prefixes, at most `tokenBudget`
prompt tokens per engine per event, to a new engine before it takes traffic
and to the survivors of a scale-in (docs/router.md, "Warm-up").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedinfer.contracts.routing.warmup import DEFAULT_PREFIXES, DEFAULT_TOKEN_BUDGET, MAX_ENTRIES, warmup_enabled

PATH = "spec.router.warmup"
MAX_TOKEN_BUDGET = 1 << 24


@dataclass(frozen=True)
class RouterWarmup:
    prefixes: int = DEFAULT_PREFIXES
    token_budget: int = DEFAULT_TOKEN_BUDGET

    @property
    def enabled(self) -> bool:
        """Whether the router replays anything (the router's own rule)."""
        return warmup_enabled(self.prefixes, self.token_budget)

    def router_args(self) -> list[str]:
        """The router's flags; with warm-up on it also sets the engine pods' readiness gate (engine_flags)."""
        gate = ["--warmup-readiness-gate"] if self.enabled else []
        return ["--warmup-prefixes", str(self.prefixes), "--warmup-token-budget", str(self.token_budget), *gate]


def _count(raw: Mapping[str, Any], key: str, default: int, maximum: int, problems: list[str]) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        problems.append(f"{PATH}.{key}: must be an integer from 0 to {maximum}, got {value!r}")
        return default
    return value


def parse_warmup(raw: Any, problems: list[str]) -> RouterWarmup:
    """`spec.router.warmup` (None when absent) -> RouterWarmup; problems are appended to `problems`."""
    if raw is None:
        return RouterWarmup()
    if not isinstance(raw, Mapping):
        problems.append(f"{PATH}: must be an object {{prefixes, tokenBudget}}, got {type(raw).__name__}")
        return RouterWarmup()
    unknown = sorted(set(raw) - {"prefixes", "tokenBudget"})
    if unknown:
        problems.append(f"{PATH}: unknown field(s) {', '.join(unknown)}")
    return RouterWarmup(
        _count(raw, "prefixes", DEFAULT_PREFIXES, MAX_ENTRIES, problems),
        _count(raw, "tokenBudget", DEFAULT_TOKEN_BUDGET, MAX_TOKEN_BUDGET, problems),
    )
