"""Engine pods' /metrics played by HTTP servers we control, each on its own loopback address (for the
autoscaler's tests: tests/operator/test_autoscaling_handlers.py, test_e2e_deletion_cost.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass

from aiohttp import web

from pagedinfer.testing.kubelet_harness import ENGINE_PORT, loopback_ip


@dataclass
class FakeEngine:
    """An engine pod's /metrics: `mode` is ok, garbage or silent (never answers)."""

    ip: str
    kv_usage: float = 0.0
    mode: str = "ok"
    hit_tokens_per_scrape: float = 0.0  # the prefix-cache counters grow by this (hits) and 2x (queries) per scrape
    scrapes: int = 0
    running: int = 0  # requests running (the idle rule's)
    router_queue_length: int | None = None  # set: this pod plays a router holding this many requests
    sleeping: bool = False  # POST /sleep sets it (answered 200, or `sleep_status`)
    sleep_status: int = 200

    async def metrics(self, request: web.Request) -> web.Response:
        if self.mode == "garbage":
            return web.Response(text="<html>upstream connect error</html>")
        if self.mode == "silent":
            await asyncio.sleep(30)
        self.scrapes += 1
        if self.router_queue_length is not None:
            return web.Response(text=f"pagedinfer_router_queue_length {self.router_queue_length}\n")
        hits = self.scrapes * self.hit_tokens_per_scrape
        return web.Response(
            text=f'pagedinfer_kv_cache_usage_ratio{{model_name="m"}} {self.kv_usage}\n'
            f'pagedinfer_num_requests_waiting{{model_name="m"}} 0\n'
            f'pagedinfer_num_requests_running{{model_name="m"}} {self.running}\n'
            f'pagedinfer_engine_sleeping{{model_name="m"}} {int(self.sleeping)}\n'
            f'pagedinfer_prefix_cache_queries_total{{model_name="m"}} {2 * hits}\n'
            f'pagedinfer_prefix_cache_hits_total{{model_name="m"}} {hits}\n'
        )

    async def sleep(self, request: web.Request) -> web.Response:
        if self.sleep_status == 200:
            self.sleeping = True
        return web.Response(status=self.sleep_status, text="{}")


@contextlib.asynccontextmanager
async def fake_engines(count: int):
    """`count` FakeEngines, each an HTTP server on its own loopback address, served
    from a thread of their own (as separate pods are): kopf, stopping, cancels
    every task of its own event loop."""
    engines = []
    for _ in range(count):
        engines.append(FakeEngine(loopback_ip({e.ip for e in engines})))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def serve():
        runners = []
        for engine in engines:
            app = web.Application()
            app.router.add_get("/metrics", engine.metrics)
            app.router.add_post("/sleep", engine.sleep)
            runner = web.AppRunner(app, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, engine.ip, ENGINE_PORT).start()
            runners.append(runner)
        return runners

    runners = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    try:
        yield engines
    finally:

        async def cleanup():
            for runner in runners:
                await runner.cleanup()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
