"""The router's warm-up: observes its traffic, warms new engines, hands a leaving engine's prefixes on.

`observe(model, ids, block_size)` counts each user request in the hotness
table (the token ids the router computed for prefix scoring). RouterState
calls `warm_new_engine(url)` when an engine is healthy for the first time
(scale-up, a rollout's new pod) and keeps it out of the candidates until it
returns, and `hand_off(victim, survivors)` when discovery removes an engine
(a terminating pod: scale-in or a rollout's old pod), which replays the
victim's hot prefixes to the survivors in the background while they serve.
With `settings.enabled` false every call does nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from pagedinfer.router.policy import EngineView
from pagedinfer.router.warmup import plan
from pagedinfer.router.warmup.hotness import HotnessTable
from pagedinfer.router.warmup.replay import Warmer
from pagedinfer.router.warmup.settings import WarmupSettings

logger = logging.getLogger("pagedinfer.router.warmup")

NEW_ENGINE, HAND_OFF = "new-engine", "hand-off"  # the `event` label of the router's warm-up counters


class WarmupCoordinator:
    def __init__(self, settings: WarmupSettings, warmer: Warmer, view_of: Callable[[str], EngineView | None]) -> None:
        self.settings = settings
        self.warmer = warmer
        self.view_of = view_of
        self.table: HotnessTable | None = None
        self._tasks: set[asyncio.Task] = set()

    def observe(self, model: object, token_ids: Sequence[int] | None, block_size: int) -> None:
        if not self.settings.enabled or not isinstance(model, str) or not token_ids:
            return
        if self.table is None or self.table.block_size != block_size:
            self.table = HotnessTable(block_size)  # a new block size: the old blocks mean nothing
        self.table.observe(model, token_ids)

    async def warm_new_engine(self, url: str) -> int:
        """Replay the hottest prefixes to a new engine; returns the prompt tokens replayed."""
        view = self.view_of(url)
        if self.table is None or view is None or not self.settings.enabled:
            return 0
        replays = plan.for_new_engine(self.table.hottest(), view, self.table.block_size, self.settings)
        return await self.warmer.replay(replays, NEW_ENGINE)

    def hand_off(self, victim: EngineView, survivors: list[EngineView]) -> None:
        """Start replaying the victim's hot prefixes to the survivors (a background task)."""
        if self.table is None or not self.settings.enabled:
            return
        replays = plan.for_victim(self.table.hottest(), victim, survivors, self.table.block_size, self.settings)
        if not replays:
            return
        logger.info(
            "handing %d hot prefixes of %s to %s",
            len(replays),
            victim.name,
            ", ".join(sorted({r.engine for r in replays})),
        )
        task = asyncio.create_task(self.warmer.replay(replays, HAND_OFF))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
