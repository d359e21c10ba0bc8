"""Routing benchmark: 4 engines behind `pagedinfer router`, per policy, against one big engine (the ceiling).

Workload: `--tenants` tenants, each a long shared system prompt and a
conversation that grows by one user turn per request (`--turns`); each tenant
runs its turns in order, tenants run concurrently. Every policy sees the same
request sequence on fresh engines (`pagedinfer serve --kv-events` on the
embedded model, 127.0.0.2-5, `--blocks` KV blocks each). The ceiling is one
engine with the four pools together, clients talking to it directly.

Reported per system: the aggregate prefix-cache hit rate from the engines'
own counters (pagedinfer_prefix_cache_hits / _queries), TTFT p50/p90 (the
first streamed chunk with content, not the opening role chunk), output tok/s
over the whole run, and requests per engine.

    .venv/bin/python bench/routing.py            # the figures in docs/router.md
    .venv/bin/python bench/routing.py --smoke    # a tiny run (tests/bench)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from pagedinfer.testing.server_process import wait_process_healthy

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa"
    " quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cli() -> str:
    return str(Path(sys.executable).with_name("pagedinfer"))


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([cli(), *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def start_engine(
    host: str, blocks: int, max_model_len: int, log: Path, extra_args: tuple[str, ...] = ()
) -> tuple[str, subprocess.Popen]:
    port = free_port(host)
    proc = start(
        [
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            "--device",
            "cpu",
            "--num-gpu-blocks-override",
            str(blocks),
            "--max-model-len",
            str(max_model_len),
            "--kv-events",
            "--kv-events-port",
            "0",
            "--max-waiting-requests",
            "10000",
            "--log-level",
            "warning",
            *extra_args,
        ],
        log,
    )
    return f"http://{host}:{port}", proc


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Terminate in reverse start order (a router first, so it never sees an engine go); kill what lingers."""
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def workload(tenants: int, turns: int, system_words: int, seed: int = 0) -> list[list[list[dict]]]:
    """Per tenant, the message lists of its turns in order."""
    rng = random.Random(seed)
    out = []
    for t in range(tenants):
        system = f"Tenant {t}. " + " ".join(rng.choice(WORDS) for _ in range(system_words))
        messages = [{"role": "system", "content": system}]
        conv = []
        for k in range(turns):
            messages = messages + [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(12))}]
            conv.append(messages)
            messages = messages + [{"role": "assistant", "content": f"answer {k} " + rng.choice(WORDS)}]
        out.append(conv)
    return out


async def run_load(url: str, convs: list[list[list[dict]]], max_tokens: int, concurrency: int) -> dict:
    ttfts, tokens, routes = [], 0, []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as client:

        async def one(messages):
            nonlocal tokens
            async with sem:
                body = {
                    "model": "pagedinfer-default",
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                t0 = time.monotonic()
                first = None
                async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    routes.append(r.headers.get("x-pagedinfer-route"))
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        choices = chunk.get("choices") or [{}]
                        if first is None and (choices[0].get("delta") or {}).get("content"):
                            first = time.monotonic() - t0  # the first token, not the opening role chunk
                        if chunk.get("usage"):
                            tokens += chunk["usage"]["completion_tokens"]
                ttfts.append(first if first is not None else time.monotonic() - t0)  # all deltas empty

        async def tenant(conv):
            for messages in conv:
                await one(messages)

        t0 = time.monotonic()
        await asyncio.gather(*(tenant(c) for c in convs))
        wall = time.monotonic() - t0
    return {"ttfts": ttfts, "tokens": tokens, "wall": wall}


def engine_counters(url: str) -> dict[str, float]:
    from pagedinfer.contracts import metric_names as m
    from pagedinfer.engine.bench.scrape import sample_totals

    names = {
        "hits": m.PREFIX_CACHE_HITS.sample,
        "queries": m.PREFIX_CACHE_QUERIES.sample,
        "requests": m.REQUEST_SUCCESS.sample,
    }
    totals = sample_totals(httpx.get(url + "/metrics", timeout=10).text, names.values())
    return {key: totals[name] or 0.0 for key, name in names.items()}


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_system(name: str, policy: str | None, args, convs, logs: Path) -> dict:
    procs, urls = [], []
    try:
        hosts = HOSTS[:1] if policy is None else HOSTS[: args.engines]
        blocks = args.blocks * args.engines if policy is None else args.blocks
        for i, host in enumerate(hosts):
            url, proc = start_engine(host, blocks, args.max_model_len, logs / f"{name}-engine{i}.log")
            procs.append(proc)
            urls.append(url)
        for url, proc in zip(urls, procs):
            wait_process_healthy(url, proc)
        target = urls[0]
        if policy is not None:
            port = free_port("127.0.0.1")
            engine_flags = [f for u in urls for f in ("--engine", u)]
            proc = start(
                ["router", *engine_flags, "--policy", policy, "--port", str(port), "--log-level", "warning"],
                logs / f"{name}-router.log",
            )
            procs.append(proc)
            target = f"http://127.0.0.1:{port}"
            wait_process_healthy(target, proc)
            time.sleep(1.0)  # the router's KV feeds take their first snapshots
        result = asyncio.run(run_load(target, convs, args.max_tokens, args.concurrency))
        counters = [engine_counters(u) for u in urls]
    finally:
        stop_all(procs)
    hits, queries = sum(c["hits"] for c in counters), sum(c["queries"] for c in counters)
    per_engine = [int(c["requests"]) for c in counters]
    return {
        "system": name,
        "hit_rate": hits / queries if queries else 0.0,
        "ttft_p50": statistics.median(result["ttfts"]),
        "ttft_p90": quantile(result["ttfts"], 0.9),
        "tok_per_s": result["tokens"] / result["wall"],
        "requests_per_engine": per_engine,
        "spread": max(per_engine) / max(1, min(per_engine)),
    }


def summarize(name: str, runs: list[dict]) -> dict:
    """Medians over the repeats; the request spread is the worst run's."""
    worst = max(runs, key=lambda r: r["spread"])
    return {
        "system": name,
        **{k: statistics.median(r[k] for r in runs) for k in ("hit_rate", "ttft_p50", "ttft_p90", "tok_per_s")},
        "requests_per_engine": worst["requests_per_engine"],
        "spread": worst["spread"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--system-words", type=int, default=200, help="words of each tenant's system prompt")
    p.add_argument("--blocks", type=int, default=352, help="KV blocks per engine (16 tokens each)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--policies", default="round-robin,least-load,prefix")
    p.add_argument("--repeats", type=int, default=1, help="runs per system, in rotated order; medians reported")
    p.add_argument("--smoke", action="store_true", help="2 engines, 4 tenants, 2 turns: checks the script runs")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--logs", type=Path, default=Path("routing-logs"))
    args = p.parse_args(argv)
    if args.smoke:
        args.engines, args.tenants, args.turns, args.system_words, args.concurrency = 2, 4, 2, 40, 4
        args.max_tokens, args.policies = 2, "round-robin,prefix"
    args.logs.mkdir(parents=True, exist_ok=True)
    convs = workload(args.tenants, args.turns, args.system_words)
    systems = [(policy, policy) for policy in args.policies.split(",")]
    systems.append((f"ceiling (1 engine, {args.engines} pools)", None))
    runs: dict[str, list[dict]] = {name: [] for name, _ in systems}
    for r in range(args.repeats):  # the order rotates, so a load change on a shared machine hits every system
        for name, policy in systems[r % len(systems) :] + systems[: r % len(systems)]:
            runs[name].append(run_system(name, policy, args, convs, args.logs))
    rows = [summarize(name, runs[name]) for name, _ in systems]
    print(
        f"{'system':<30}{'hit rate':>10}{'TTFT p50':>10}{'TTFT p90':>10}{'tok/s':>9}  requests per engine"
        f"{' (medians of ' + str(args.repeats) + ' runs)' if args.repeats > 1 else ''}"
    )
    for r in rows:
        print(
            f"{r['system']:<30}{r['hit_rate']:>9.1%}{r['ttft_p50']:>9.3f}s{r['ttft_p90']:>9.3f}s"
            f"{r['tok_per_s']:>9.1f}  {r['requests_per_engine']}"
        )
    by_name = {r["system"]: r for r in rows}
    if "prefix" in by_name and "round-robin" in by_name:
        prefix, rr, ceiling = by_name["prefix"], by_name["round-robin"], rows[-1]
        print(f"prefix vs ceiling hit rate: {prefix['hit_rate'] / ceiling['hit_rate']:.1%} (target >= 90%)")
        print(f"round-robin p90 TTFT / prefix p90 TTFT: {rr['ttft_p90'] / prefix['ttft_p90']:.2f}x (target >= 2x)")
        print(f"prefix tok/s / round-robin tok/s: {prefix['tok_per_s'] / rr['tok_per_s']:.2f} (target >= 1)")
        print(f"prefix: most / fewest requests per engine: {prefix['spread']:.2f} (target <= 1.5)")
    if args.json_out:
        args.json_out.write_text(json.dumps({"summary": rows, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
