"""How much a router's warm-up replays: the defaults of `--warmup-prefixes` (K) and
`--warmup-token-budget`, and the bounds the operator's `spec.router.warmup` parser holds them to, so the
router's flags and the CRD agree. No imports.
"""

DEFAULT_PREFIXES = 8  # K: the hottest prefixes replayed per event (measured: bench/warmup_sweep.py, docs/router.md)
DEFAULT_TOKEN_BUDGET = 32768  # prompt tokens replayed per engine per event: K x MAX_PREFIX_TOKENS (4,096)
MAX_ENTRIES = 1024  # the router's table of hot prefixes holds at most this many (router/warmup/hotness.py)


def warmup_enabled(prefixes: int, token_budget: int) -> bool:
    """Whether a warm-up replays anything: the router's rule, and the operator's for the readiness gate."""
    return prefixes > 0 and token_budget > 0
