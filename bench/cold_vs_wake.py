"""Cold start against wake: `pagedinfer serve` started to its first completion, vs `POST /wake_up` to it.

For each model (`--models`: `embedded`, the default tiny model; `125m`, the
engine benchmark's 124.6 M-parameter Llama, built once with make_tiny_model
under `--model-dir`, never downloaded) and `--runs` times:
- cold: spawn `pagedinfer serve` (CPU) and send a completion (1 token) as soon
  as it answers /health; the time from the spawn to that completion's answer
  (process start, imports, model load, KV pool, warm-up, first step);
- wake: on a running server, `POST /sleep`, then time `POST /wake_up` and the
  same completion after it (the pool allocated again, first step).
With `--router`, also through `pagedinfer router` (a process in front of the
last run's server, `--wake-cycles` times): the engine put to sleep, the router
seeing it asleep (its /health says "holding"), then a completion sent to the
router: held, the engine woken by the router's POST /wake_up, answered; against
the same completion through the router with the engine awake.
Also the awake server's completion alone (the floor both include) and what
sleep released. Prints medians and cold / wake, in wall seconds and in the
server's CPU seconds (its process tree's utime + stime, `proc_stats.py`),
which a loaded machine inflates far less than wall time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/cold_vs_wake.py --models embedded,125m --runs 5
    OMP_NUM_THREADS=1 .venv/bin/python bench/cold_vs_wake.py --models embedded --runs 1 --router --wake-cycles 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from proc_stats import CLOCK_TICKS_PER_SECOND, tree_cpu_seconds

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.testing.server_process import free_port

MODEL_125M = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    intermediate_size=2048,
    max_position_embeddings=2048,
    vocab_size=32000,
)  # bench/throughput.py's
BODY = {"model": "m", "prompt": "Hello there, how are you today?", "max_tokens": 1}


def model_dir(name: str, root: Path) -> Path:
    if name == "embedded":
        return default_model_dir()
    from pagedinfer.engine.tiny_model import make_tiny_model

    return make_tiny_model(root / name, arch="llama", **MODEL_125M)


def spawn(model: Path, port: int, log: Path) -> subprocess.Popen:
    cmd = [
        str(Path(sys.executable).with_name("pagedinfer")),
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-model-len",
        "1024",
        "--served-model-name",
        "m",
    ]
    return subprocess.Popen(
        cmd,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )


def first_completion(url: str, proc: subprocess.Popen, start: float, timeout_s: float = 600) -> float:
    """Once /health is 200 (polled every 10 ms), one completion; the seconds from `start` to /health's 200.
    Raises if the server exits or errs."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the server never became healthy")
        time.sleep(0.01)
    healthy = time.perf_counter() - start
    complete(url)
    return healthy


def complete(url: str) -> None:
    r = httpx.post(url + "/v1/completions", json=BODY, timeout=600)
    r.raise_for_status()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def through_router(url: str, root: Path, cycles: int) -> tuple[list[float], list[float]]:
    """(seconds of a completion held at the router while it wakes the engine, of one with the engine awake)."""
    port = free_port()
    router = f"http://127.0.0.1:{port}"
    cmd = [
        str(Path(sys.executable).with_name("pagedinfer")),
        "router",
        "--engine",
        url,
        "--port",
        str(port),
        "--tokenizer",
        str(default_model_dir()),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=(root / "router.log").open("w"), stderr=subprocess.STDOUT)
    woken, awake = [], []
    try:
        until(lambda: _status(router) == "ok", proc)
        for _ in range(cycles):
            awake.append(timed(lambda: complete(router)))
            httpx.post(url + "/sleep", timeout=600).raise_for_status()
            until(lambda: _status(router) == "holding", proc)  # the router saw it asleep (0.5 s health checks)
            woken.append(timed(lambda: complete(router)))
    finally:
        proc.terminate()
        proc.wait(60)
    return woken, awake


def _status(url: str) -> str | None:
    try:
        return httpx.get(url + "/health", timeout=2).json().get("status")
    except (httpx.TransportError, ValueError):
        return None


def until(condition, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the router exited or never reached the state waited for")
        time.sleep(0.02)


def measure(name: str, runs: int, root: Path, router_cycles: int = 0) -> dict:
    model = model_dir(name, root)
    cold, healthy, wake, awake, released = [], [], [], [], None
    cold_cpu, wake_cpu = [], []
    router_woken, router_awake = [], []
    for run in range(runs):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        start = time.perf_counter()
        proc = spawn(model, port, root / f"{name}-{run}.log")
        try:
            healthy.append(first_completion(url, proc, start))
            cold.append(time.perf_counter() - start)
            cold_cpu.append(tree_cpu_seconds(proc.pid))
            awake.append(timed(lambda: complete(url)))
            slept = httpx.post(url + "/sleep", timeout=600)
            slept.raise_for_status()
            released = slept.json()
            before = tree_cpu_seconds(proc.pid)
            wake.append(timed(lambda: (httpx.post(url + "/wake_up", timeout=600).raise_for_status(), complete(url))))
            wake_cpu.append(tree_cpu_seconds(proc.pid) - before)
            if router_cycles and run == runs - 1:
                router_woken, router_awake = through_router(url, root, router_cycles)
        finally:
            proc.terminate()
            proc.wait(60)
    return {
        "model": name,
        "cold": cold,
        "healthy": healthy,
        "wake": wake,
        "awake": awake,
        "released": released,
        "cold_cpu": cold_cpu,
        "wake_cpu": wake_cpu,
        "router_woken": router_woken,
        "router_awake": router_awake,
    }


def cpu_ratio(cold_cpu: float, wake_cpu: float) -> str:
    """cold / wake; /proc counts CPU time in ticks (1/100 s): a wake under one tick gives a lower bound."""
    tick = 1 / CLOCK_TICKS_PER_SECOND
    return f"{cold_cpu / wake_cpu:.0f}x" if wake_cpu >= tick else f">= {cold_cpu / tick:.0f}x (wake < 1 tick)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="embedded,125m", help="comma-separated: embedded, 125m")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--router", action="store_true", help="also through `pagedinfer router` (see above)")
    p.add_argument("--wake-cycles", type=int, default=5, help="sleep/wake cycles through the router (default 5)")
    p.add_argument("--model-dir", default=None, help="where the 125m model is built (default: a temporary dir)")
    args = p.parse_args()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    bad = [n for n in names if n not in ("embedded", "125m")]
    if bad or args.runs < 1:
        p.error(f"--models: embedded and/or 125m (got {bad}); --runs >= 1")
    root = Path(args.model_dir or tempfile.mkdtemp(prefix="cold-vs-wake-"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"CPU, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset: 1)')}, {args.runs} runs each,"
        f" load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| model | cold start to first completion (s) | of which to /health 200 (s) | wake to first completion"
        " (s) | cold / wake | CPU s: cold; wake; cold / wake | awake completion (s) | sleep released (KV pool;"
        " weights) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    routers = []
    for name in names:
        r = measure(name, args.runs, root, args.wake_cycles if args.router else 0)
        cold, healthy, wake, awake, cold_cpu, wake_cpu = (
            statistics.median(r[k]) for k in ("cold", "healthy", "wake", "awake", "cold_cpu", "wake_cpu")
        )
        released = r["released"]
        print(
            f"| {name} | {cold:.2f} | {healthy:.2f} | {wake:.3f} | {cold / wake:.0f}x |"
            f" {cold_cpu:.1f}; {wake_cpu:.2f}; {cpu_ratio(cold_cpu, wake_cpu)} | {awake:.3f} |"
            f" {released['kv_bytes'] / 2**20:.0f} MiB; {released['weight_bytes']} bytes |",
            flush=True,
        )

        if r["router_woken"]:
            woken, awake = statistics.median(r["router_woken"]), statistics.median(r["router_awake"])
            routers.append(f"| {name} | {woken:.3f} | {awake:.3f} | {len(r['router_woken'])} |")
    if routers:
        print(
            "\nthrough `pagedinfer router` (medians):\n| model | completion held while the router wakes the engine (s)"
            " | completion, engine awake (s) | cycles |\n|---|---|---|---|"
        )
        print("\n".join(routers))


if __name__ == "__main__":
    main()
