"""How much a warm-up replays: `--warmup-prefixes` (K) and `--warmup-token-budget` (their defaults are
contracts, `pagedinfer.contracts.routing.warmup`, shared with the operator's `spec.router.warmup`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedinfer.contracts import validators
from pagedinfer.contracts.routing.warmup import DEFAULT_PREFIXES, DEFAULT_TOKEN_BUDGET, warmup_enabled

MAX_PREFIX_TOKENS = 4096  # one warm-up prefill at most (longer hot prefixes are replayed truncated)


@dataclass(frozen=True)
class WarmupSettings:
    """prefixes 0 turns warm-up off; token_budget bounds the prompt tokens replayed to one engine per event."""

    prefixes: int = DEFAULT_PREFIXES
    token_budget: int = DEFAULT_TOKEN_BUDGET

    def __post_init__(self) -> None:
        validators.non_negative_int("prefixes", self.prefixes)
        validators.non_negative_int("token_budget", self.token_budget)

    @property
    def enabled(self) -> bool:
        return warmup_enabled(self.prefixes, self.token_budget)
