"""How much a warm-up replays: `--warmup-prefixes` (K) and `--warmup-token-budget`, and their defaults.

No imports: the operator's `spec.router.warmup` parser takes its defaults
from here, so the router's flags and the CRD agree.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIXES = 32  # K: the hottest prefixes replayed per event (bench/routing_lifecycle.py)
DEFAULT_TOKEN_BUDGET = 32768  # prompt tokens replayed per engine per event
MAX_PREFIX_TOKENS = 4096  # one warm-up prefill at most (longer hot prefixes are replayed truncated)


@dataclass(frozen=True)
class WarmupSettings:
    """prefixes 0 turns warm-up off; token_budget bounds the prompt tokens replayed to one engine per event."""

    prefixes: int = DEFAULT_PREFIXES
    token_budget: int = DEFAULT_TOKEN_BUDGET

    def __post_init__(self) -> None:
        if self.prefixes < 0:
            raise ValueError(f"prefixes: must be >= 0, got {self.prefixes}")
        if self.token_budget < 0:
            raise ValueError(f"token_budget: must be >= 0, got {self.token_budget}")

    @property
    def enabled(self) -> bool:
        return self.prefixes > 0 and self.token_budget > 0
