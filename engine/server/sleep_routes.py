"""POST /sleep, POST /wake_up, GET /is_sleeping: vLLM's sleep-mode routes (level 1), behind --api-key.

- `POST /sleep[?level=1]`: with no request in flight, empties the prefix
  cache (AllBlocksCleared on the KV events), releases the KV pool and moves the
  weights to host memory (`engine/sleep/sleeper.py`; on a CPU engine the
  weights stay: they are host memory). With requests in flight it is refused
  with 409 `requests_in_flight`, never a drain: whoever sleeps an engine (the
  operator's standby, a person) does so when it is idle, and a refusal
  it can retry is plainer than requests held or cut. Only level 1 exists: any
  other level is a 400 naming `level`.
- `POST /wake_up`: the weights and the same KV pool back.
- `GET /is_sleeping`: `{"is_sleeping": bool}`.
They are left out of /openapi.json (admin routes). Each answers with the state after it and, for sleep and wake, what moved:
`{"is_sleeping", "kv_bytes", "weight_bytes", "seconds"}`; asleep or awake
already, the call changes nothing and says 0.

While asleep, `/health` stays 200 with `{"status": "asleep"}` (the pod stays
ready: waking it is the router's job), a completion gets 503 with
Retry-After and code `asleep`, and `pagedinfer_engine_sleeping` is 1.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import FastAPI

from pagedinfer.contracts.http.errors import ApiError
from pagedinfer.engine.server.engine_loop import EngineLoop, RequestFailed

SLEEP_PATHS = ("/sleep", "/wake_up", "/is_sleeping")  # behind the API key, as /v1
# Admin routes, left out of /openapi.json: a client generated from it (or a fuzzer) must not put the server to sleep.
ADMIN = {"include_in_schema": False}


def install_sleep_routes(app: FastAPI, engine_loop: EngineLoop) -> None:
    sleepers: dict[str, Any] = {}  # the engine's EngineSleep, made on the engine thread at the first call

    def sleeper(engine: Any) -> Any:
        from pagedinfer.engine.sleep.sleeper import EngineSleep

        return sleepers.setdefault("engine", EngineSleep(engine))

    def go_to_sleep(engine: Any) -> Any:
        report = sleeper(engine).sleep()
        engine_loop.sleeping = True
        return report

    def wake_up(engine: Any) -> Any:
        report = sleeper(engine).wake()
        engine_loop.sleeping = False
        return report

    async def run(function: Any) -> dict:
        if engine_loop.info is None:
            raise ApiError(503, "the model is still loading", code="model_loading", headers={"Retry-After": "1"})
        from pagedinfer.engine.sleep.sleeper import SleepRefused

        try:
            report = await engine_loop.call(function)
        except SleepRefused as exc:
            raise ApiError(409, str(exc), code="requests_in_flight") from None
        except RequestFailed as exc:
            raise ApiError(exc.status_code, exc.message, exc.param, exc.code) from None
        return asdict(report)

    @app.post("/sleep", **ADMIN)
    async def sleep(level: int = 1) -> dict:
        if level != 1:
            raise ApiError(
                400,
                f"level: only sleep level 1 exists (KV pool released, weights to host memory), got {level}",
                "level",
                "invalid_parameter",
            )
        return await run(go_to_sleep)

    @app.post("/wake_up", **ADMIN)
    async def wake() -> dict:
        return await run(wake_up)

    @app.get("/is_sleeping", **ADMIN)
    async def is_sleeping() -> dict:
        return {"is_sleeping": engine_loop.sleeping}
