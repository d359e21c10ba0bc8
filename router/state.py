"""The router's view of its engines, owned by one asyncio loop (no locks: one owner).

Each engine has a supervisor task: it polls GET /health; while the engine
is healthy a KVFeed keeps its cached-hash set current. An engine that fails a
health check or a connection is dropped at once: marked unhealthy, its
hashes forgotten, its feed cancelled, and its `lost` event set, which gives up
every request waiting on it (`upstream.py`); the supervisor keeps polling and
a restarted engine comes back from a fresh snapshot, with a new `lost` event.
An engine whose KV-event publisher went silent (`kv_feed.py`, heartbeats) stays
routable, but its blocks are not scored (`kv_stale`) until its feed catches up.

Asleep engines (scale to zero, `engine/sleep/`): an engine whose /health is
200 with {"status": "asleep"} stays healthy (its feed runs on: its sleep
cleared its cache, AllBlocksCleared said so) but is not routable: `views()`
leaves it out and `asleep_views()` lists it, for the hold queue's waker. An
engine found asleep by a request (its 503 says `asleep`) is marked so at once
(`mark_asleep`); one woken by `wake` is routable at once. Whenever an engine
becomes routable, `on_routable()` runs (the router releases its hold queue).

Readiness gates (discovery with `--warmup-readiness-gate`): an endpoint that
is not ready yet (and not terminating) is followed too, with its pod's name
(`gate_pod`), but is never routable: once healthy it is warmed (bounded by
`WARMUP_GATE_TIMEOUT_SECONDS`), then `open_gate(pod, reason, message)` sets
its pod's warmed condition (retried at each health check until it succeeds),
the kubelet marks the pod Ready and discovery lists it ready: only then is it
routable, already warm.

Logged at INFO: each engine's transitions only (healthy, dropped, healthy
again), never a health check that changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from pagedinfer.contracts.routing.lifecycle import WARMUP_GATE_TIMEOUT_SECONDS
from pagedinfer.router.kv_feed import Discovery, KVFeed
from pagedinfer.router.policy import EngineView

logger = logging.getLogger("pagedinfer.router")

HEALTH_INTERVAL_SECONDS = 0.5
HEALTH_TIMEOUT_SECONDS = 2.0
WAKE_TIMEOUT_SECONDS = 120.0  # a wake moves the weights back to the device: seconds on a large GPU model
ASLEEP_STATUS = "asleep"  # /health's {"status": ...} of a sleeping engine (engine/server/sleep_routes.py)


@dataclass
class EngineRecord:
    url: str
    healthy: bool = False
    hashes: set[bytes] = field(default_factory=set)
    tier_hashes: set[bytes] = field(default_factory=set)  # blocks in its host tier (KV events of medium CPU)
    block_size: int | None = None
    kv_seq: int | None = None
    kv_stale: bool = False  # its publisher went silent: its hashes are kept but not scored until it resumes
    num_inflight: int = 0
    feed_task: asyncio.Task | None = None
    lost: asyncio.Event = field(default_factory=asyncio.Event)  # set when dropped; a fresh one when back
    dropped_why: str | None = None  # why it was last dropped; None while healthy or never yet healthy
    asleep: bool = False  # its /health said asleep (or a request was refused as asleep); not routable
    warming: bool = False  # its warm-up replays run (router/warmup/): not routable until they are done
    ever_healthy: bool = False  # warmed (or not) once: a later comeback is not a new engine
    gate_pod: str | None = None  # its pod, while its endpoint is not ready (it waits on its readiness gate)
    warmup_result: tuple[str, str] | None = None  # (reason, message) of its warm-up, once it ended
    gate_opened: bool = False  # this router set its pod's warmed condition

    def view(self) -> EngineView:
        if self.kv_stale:
            return EngineView(self.url, self.num_inflight, frozenset(), frozenset())
        return EngineView(self.url, self.num_inflight, self.hashes, self.tier_hashes)


class RouterState:
    def __init__(
        self,
        urls: list[str],
        client: httpx.AsyncClient,
        on_discovery: Callable[[str, Discovery], Awaitable[None]] | None = None,
        on_routable: Callable[[], None] | None = None,
        admin_headers: dict[str, str] | None = None,
        on_new_engine: Callable[[str], Awaitable[int]] | None = None,
        on_leaving: Callable[[EngineView, list[EngineView]], None] | None = None,
        open_gate: Callable[[str, str, str], Awaitable[bool]] | None = None,
    ) -> None:
        """on_discovery(url, info): each engine's GET /kv_events, read when its feed starts; on_routable():
        an engine became routable; admin_headers: sent with POST /wake_up (the engines' API key);
        on_new_engine(url): awaited when an engine is healthy for the first time (its warm-up), which is
        routable once it returns; on_leaving(engine, survivors): discovery removed an engine (its hand-off);
        open_gate(pod, reason, message): set a warmed pod's readiness-gate condition, True once done."""
        self.engines = {url: EngineRecord(url) for url in urls}
        self.client = client
        self.on_discovery = on_discovery
        self.on_routable = on_routable or (lambda: None)
        self.admin_headers = admin_headers or {}
        self.on_new_engine = on_new_engine
        self.on_leaving = on_leaving
        self.open_gate = open_gate
        self._supervisors: dict[str, asyncio.Task] = {}
        self._warmups: set[asyncio.Task] = set()
        self._started = False

    def set_engines(self, urls: list[str], pending: dict[str, str] | None = None) -> None:
        """Follow exactly these engines (discovery): new ones are health-checked, gone ones forgotten at once.

        pending: URL -> pod of endpoints not ready yet (readiness gates): followed and warmed, not routable.
        A request still in flight on a removed engine finishes; its record is no
        longer consulted for new requests.
        """
        pending = {u: pod for u, pod in (pending or {}).items() if u not in urls}
        leaving = [u for u in self.engines if u not in urls and u not in pending]
        if leaving and self.on_leaving is not None:
            survivors = [v for v in self.views() if v.name in urls]
            for url in leaving:
                if self.engines[url].healthy:
                    self.on_leaving(self.engines[url].view(), survivors)
        for url in leaving:
            record = self.engines.pop(url)
            self._cancel_feed(record)
            task = self._supervisors.pop(url, None)
            if task is not None:
                task.cancel()
            logger.info("engine %s removed (no longer a ready endpoint)", url)
        for url in [*urls, *pending]:
            if url not in self.engines:
                self.engines[url] = EngineRecord(url)
                if self._started:
                    self._supervisors[url] = asyncio.create_task(self._supervise(self.engines[url]))
                logger.info("engine %s added%s", url, f" (pod {pending[url]}, not ready yet)" if url in pending else "")
        for url, engine in self.engines.items():
            was_pending, engine.gate_pod = engine.gate_pod is not None, pending.get(url)
            if was_pending and engine.gate_pod is None and engine.healthy and not engine.asleep and not engine.warming:
                self.on_routable()  # its pod turned ready

    def views(self) -> list[EngineView]:
        """The routable engines: healthy, awake, not warming up and not waiting on their readiness gate."""
        return [
            e.view()
            for e in self.engines.values()
            if e.healthy and not e.asleep and not e.warming and e.gate_pod is None
        ]

    def asleep_views(self) -> list[EngineView]:
        return [e.view() for e in self.engines.values() if e.healthy and e.asleep]

    def set_asleep(self, url: str, asleep: bool, why: str) -> None:
        engine = self.engines.get(url)
        if engine is None or engine.asleep == asleep:
            return
        engine.asleep = asleep
        logger.info("engine %s %s (%s)", url, "asleep" if asleep else "awake", why)
        if not asleep and engine.healthy:
            self.on_routable()

    def mark_asleep(self, url: str) -> None:
        """A request was refused as asleep: route no more to it until it is awake."""
        self.set_asleep(url, True, "it refused a request as asleep")

    async def wake(self, url: str) -> str | None:
        """POST /wake_up to the engine; None once it says it is awake (it is routable then), else why not."""
        try:
            r = await self.client.post(url + "/wake_up", headers=self.admin_headers, timeout=WAKE_TIMEOUT_SECONDS)
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if r.status_code != 200:
            return f"POST /wake_up answered {r.status_code}"
        self.set_asleep(url, False, "woken")
        return None

    @property
    def block_size(self) -> int | None:
        return next((e.block_size for e in self.engines.values() if e.healthy and e.block_size), None)

    def start(self) -> None:
        self._started = True
        self._supervisors = {url: asyncio.create_task(self._supervise(e)) for url, e in self.engines.items()}

    async def stop(self) -> None:
        for e in self.engines.values():
            self._cancel_feed(e)
        tasks = [*self._supervisors.values(), *self._warmups]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def mark_dead(self, url: str, why: str) -> None:
        engine = self.engines.get(url)
        if engine is None:  # discovery removed it meanwhile
            return
        if engine.healthy:
            logger.warning("engine %s dropped: %s", url, why)
            engine.dropped_why = why
        engine.lost.set()
        engine.healthy = False
        engine.hashes = set()
        engine.tier_hashes = set()
        engine.kv_seq = None
        engine.kv_stale = False
        self._cancel_feed(engine)

    def _cancel_feed(self, engine: EngineRecord) -> None:
        if engine.feed_task is not None:
            engine.feed_task.cancel()
            engine.feed_task = None

    async def _supervise(self, engine: EngineRecord) -> None:
        while True:
            asleep = False
            try:
                r = await self.client.get(engine.url + "/health", timeout=HEALTH_TIMEOUT_SECONDS)
                ok = r.status_code == 200
                asleep = ok and _health_status(r) == ASLEEP_STATUS
            except httpx.HTTPError as exc:
                ok, why = False, f"{type(exc).__name__}"
            else:
                why = "unhealthy"
            if ok:
                self.set_asleep(engine.url, asleep, "its /health says so")
            if ok and not engine.healthy:
                if engine.dropped_why is None:
                    logger.info("engine %s healthy", engine.url)
                else:
                    logger.info("engine %s healthy again (dropped: %s)", engine.url, engine.dropped_why)
                engine.dropped_why = None
                engine.lost = asyncio.Event()
                engine.healthy = True
                engine.feed_task = asyncio.create_task(self._follow(engine))
                if not engine.ever_healthy and self.on_new_engine is not None:
                    engine.warming = True
                    task = asyncio.create_task(self._warm(engine))
                    self._warmups.add(task)
                    task.add_done_callback(self._warmups.discard)
                engine.ever_healthy = True
                if not engine.asleep and not engine.warming and engine.gate_pod is None:
                    self.on_routable()
            elif not ok and engine.healthy:
                self.mark_dead(engine.url, why)
            if ok and engine.gate_pod is not None and not engine.warming and not engine.gate_opened:
                await self._open_gate(engine, engine.gate_pod)
            await asyncio.sleep(HEALTH_INTERVAL_SECONDS)

    async def _open_gate(self, engine: EngineRecord, pod: str) -> None:
        if self.open_gate is None:
            return
        reason, message = engine.warmup_result or ("NotWarmed", "the router's warm-up is off")
        engine.gate_opened = await self.open_gate(pod, reason, message)

    async def _warm(self, engine: EngineRecord) -> None:
        try:
            async with asyncio.timeout(WARMUP_GATE_TIMEOUT_SECONDS):
                tokens = await self.on_new_engine(engine.url)
            engine.warmup_result = ("Warmed", f"the router replayed {tokens} prompt tokens of its hot prefixes")
        except TimeoutError:
            logger.warning(
                "warm-up of %s still running after %g s; routing it as it is", engine.url, WARMUP_GATE_TIMEOUT_SECONDS
            )
            engine.warmup_result = ("WarmupTimedOut", f"the warm-up took over {WARMUP_GATE_TIMEOUT_SECONDS:g} s")
        except Exception as exc:  # noqa: BLE001 - a failed warm-up leaves the engine cold, never out of service
            logger.warning("warm-up of %s failed (%s); routing it cold", engine.url, exc)
            engine.warmup_result = ("WarmupFailed", f"the warm-up failed: {type(exc).__name__}")
        finally:
            engine.warming = False  # its gate, if it waits on one, is opened at its next health check
            if engine.healthy and not engine.asleep and engine.gate_pod is None:
                self.on_routable()

    async def _follow(self, engine: EngineRecord) -> None:
        def update(hashes: set[bytes], seq: int | None, block_size: int) -> None:
            engine.hashes, engine.kv_seq, engine.block_size = hashes, seq, block_size
            engine.tier_hashes = feed.tier_hashes

        def stale(is_stale: bool) -> None:
            engine.kv_stale = is_stale

        feed = KVFeed(engine.url, update, self.client, self.on_discovery, stale)
        try:
            await feed.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a feed that fails leaves the engine routable by load only
            logger.warning("KV events of %s unavailable (%s); routing it by load only", engine.url, exc)
            engine.hashes = set()
            engine.kv_stale = False
            engine.tier_hashes = set()


def _health_status(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("status") if isinstance(body, dict) else None
