"""While requests are held: release them to a ready engine, else wake an asleep one, else signal demand.

One task, the only one that acts on the queue's behalf, every `TICK_SECONDS`
while the queue is non-empty (idle otherwise: it waits for an entry):
1. an engine is ready (healthy and awake): release the queue (the state also
   releases it at once when an engine becomes ready; the tick is a backstop);
2. else an engine is asleep (healthy, `/health` says asleep) and no wake is in
   flight: POST `/wake_up` to the one the routing policy picks among the asleep
   ones (`wake_engine`); on 200 the state marks it awake and the queue is
   released to it. A failed wake is not tried again for `WAKE_RETRY_SECONDS`;
3. else (no engine at all, or a wake failed): signal demand (`demand.py`),
   at most once per its interval, so the operator starts a pod.

`problem()` says why nothing is ready yet, for the 503 of a request that
times out: the wake that failed, the API that cannot be reached, or that no
engine came up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from pagedinfer.router.hold.demand import DemandSignal
from pagedinfer.router.hold.queue import HoldQueue

logger = logging.getLogger("pagedinfer.router.hold")

TICK_SECONDS = 0.25
WAKE_RETRY_SECONDS = 5.0


class Capacity:
    def __init__(
        self,
        queue: HoldQueue,
        ready: Callable[[], bool],
        asleep: Callable[[], list[str]],
        wake: Callable[[str], Awaitable[str | None]],
        demand: DemandSignal | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """ready(): an engine can take requests; asleep(): the asleep engines, best to wake first;
        wake(url): None once awake, else why not."""
        self.queue = queue
        self.ready = ready
        self.asleep = asleep
        self.wake = wake
        self.demand = demand
        self.clock = clock
        self._waking: asyncio.Task | None = None
        self._wake_failed: tuple[float, str] | None = None  # (when, why)
        self._signalling: asyncio.Task | None = None

    def problem(self) -> str:
        if self.demand is not None and self.demand.problem is not None:
            return self.demand.problem
        if self._wake_failed is not None:
            return self._wake_failed[1]
        if self.demand is not None and self.demand.num_signals:
            return "demand was signalled to the operator, but no engine became ready in time"
        return "no engine became ready"

    async def run(self) -> None:
        try:
            while True:
                if not len(self.queue):
                    self.queue.entered.clear()
                    await self.queue.entered.wait()
                self.tick()
                await asyncio.sleep(TICK_SECONDS)
        finally:
            for task in (self._waking, self._signalling):
                if task is not None:
                    task.cancel()

    def tick(self) -> None:
        if self.ready():
            self.queue.release()
            return
        if self._waking is not None and not self._waking.done():
            return
        wake_blocked = self._wake_failed is not None and self.clock() - self._wake_failed[0] < WAKE_RETRY_SECONDS
        asleep = self.asleep()
        if asleep and not wake_blocked:
            self._waking = asyncio.create_task(self._wake(asleep[0]))
            return
        if self.demand is not None and self.demand.due() and (self._signalling is None or self._signalling.done()):
            self._signalling = asyncio.create_task(self.demand.signal())

    async def _wake(self, url: str) -> None:
        logger.info("waking engine %s (%d requests held)", url, len(self.queue))
        why = await self.wake(url)
        if why is None:
            self._wake_failed = None
            self.queue.release()
        else:
            logger.warning("could not wake engine %s: %s", url, why)
            self._wake_failed = (self.clock(), f"the asleep engine {url} did not wake: {why}")
