"""Sending warm-up replays: prefill-only completions, one at a time per engine, marked as warm-up.

Each replay is `POST /v1/completions {"model", "prompt": [token ids],
"max_tokens": 1, "temperature": 0}` with `x-pagedinfer-warmup: 1`, so the
engine keeps it out of its request series (contracts/http/warmup_requests.py).
The token ids are the ones the router computed for the tenant's requests, so
the engine caches exactly the blocks those requests will look up.

The bound on user traffic: an engine runs at most one warm-up at a time
(a lock per engine), each at most `MAX_PREFIX_TOKENS` prompt tokens and one
output token, and at most `token_budget` tokens per engine per event. A user
request sent to a survivor during a hand-off therefore shares its engine
with at most one warm-up prefill of at most 4,096 tokens (a new engine takes
no user request until its warm-up is done). A replay that fails (the engine
went, a 4xx) is logged and skipped: warm-up is an optimisation, never a
reason to hold an engine back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import httpx

from pagedinfer.contracts.http.warmup_requests import WARMUP_HEADER
from pagedinfer.router.warmup.plan import Replay

logger = logging.getLogger("pagedinfer.router.warmup")

REPLAY_TIMEOUT_SECONDS = 60.0  # one prefill of at most MAX_PREFIX_TOKENS, behind the engine's own queue


class Warmer:
    def __init__(
        self,
        client: httpx.AsyncClient,
        headers: dict[str, str],
        on_replayed: Callable[[str, int], None] = lambda event, tokens: None,
    ) -> None:
        """headers: sent with each replay (the engines' API key); on_replayed(event, tokens): each one done."""
        self.client = client
        self.headers = {**headers, WARMUP_HEADER: "1"}
        self.on_replayed = on_replayed
        self._locks: dict[str, asyncio.Lock] = {}

    async def replay(self, replays: Sequence[Replay], event: str) -> int:
        """Send `replays` (each engine's in order, engines in parallel); returns the prompt tokens replayed."""
        by_engine: dict[str, list[Replay]] = {}
        for r in replays:
            by_engine.setdefault(r.engine, []).append(r)
        done = await asyncio.gather(*(self._engine(url, rs, event) for url, rs in by_engine.items()))
        return sum(done)

    async def _engine(self, url: str, replays: list[Replay], event: str) -> int:
        tokens = 0
        for r in replays:
            async with self._locks.setdefault(url, asyncio.Lock()):
                body = {"model": r.model, "prompt": list(r.token_ids), "max_tokens": 1, "temperature": 0.0}
                try:
                    response = await self.client.post(
                        url + "/v1/completions", json=body, headers=self.headers, timeout=REPLAY_TIMEOUT_SECONDS
                    )
                except httpx.HTTPError as exc:
                    logger.warning("warm-up of %s stopped: %s", url, type(exc).__name__)
                    return tokens
            if response.status_code != 200:
                logger.warning("warm-up of %s: a replay answered %d; skipped", url, response.status_code)
                continue
            tokens += len(r.token_ids)
            self.on_replayed(event, len(r.token_ids))
        if replays:
            logger.info("warmed %s (%s): %d prefixes, %d prompt tokens", url, event, len(replays), tokens)
        return tokens
