"""bench/routing_lifecycle.py's request trace by count: the same requests, in the same order, in every mode.

Recomputed prefill tokens are a count, not a time: on a loaded machine a
time window holds a different number of requests in each run, and whatever
the warm-up saves drowns in that noise. With `--trace-requests N` the run
sends a fixed trace instead: `--steady-requests` requests before the event,
then no traffic while the event happens (the scale, the rollout, and in mode
c the warm-up and hand-off replays), then, once the engines are settled and
routable, the next N requests of the same seeded trace. Every mode sends
exactly the same prompts in the same order (the workers take them from one
list, in order; only which of `--concurrency` requests run side by side can
differ), so the recomputed tokens of (a) and (c) compare request for request.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field


@dataclass
class Record:
    start: float  # seconds since the run's start
    prompt_tokens: int
    cached_tokens: int
    ok: bool


@dataclass
class TraceResult:
    scenario: str
    mode: str
    hit_rate_before: float  # over the steady trace's second half (the caches filled)
    requests: int  # in the trace after the event
    prompt_tokens: int
    recomputed_tokens: int  # prompt - cached, over the trace after the event
    recomputed_first_quarter: int  # of them, in the first quarter of the trace (where a cold engine shows)
    aborted: int
    # with --probe-ttft (warmup_sweep.py): one user at a time while the event happens, and the warm-up's cost
    warmup_tokens: int = 0  # the router's pagedinfer_router_warmup_prompt_tokens_total after the event
    event_seconds: float = 0.0  # from the event until every pod is settled and routable (the warm-up inside it)
    probe_ttft_ms: list[float] = field(default_factory=list)  # each probe request's time to its one token


def zipf_weights(n: int) -> list[float]:
    return [1.0 / (rank + 1) for rank in range(n)]


def trace(prefixes: list[list[int]], n: int, seed: int, question_tokens: int) -> list[list[int]]:
    """n prompts: a tenant drawn by Zipf(1) popularity, its prefix, a fresh question; the same for a seed."""
    rng = random.Random(seed)
    weights = zipf_weights(len(prefixes))
    prompts = []
    for _ in range(n):
        tenant = rng.choices(range(len(prefixes)), weights)[0]
        prompts.append(prefixes[tenant] + [rng.randrange(10, 2000) for _ in range(question_tokens)])
    return prompts


async def post_prompt(client, url: str, model: str, prompt: list[int], origin: float) -> Record:
    """One completion of `prompt` (4 tokens); its record: prompt and cached tokens, and whether it was a 200."""
    import httpx

    started = time.monotonic() - origin
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0.0}
    try:
        r = await client.post(url + "/v1/completions", json=body)
        usage = r.json().get("usage") or {} if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return Record(started, len(prompt), 0, False)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Record(started, len(prompt), cached, r.status_code == 200)


async def send_trace(url: str, model: str, prompts: list[list[int]], concurrency: int, origin: float) -> list[Record]:
    """Send `prompts` in order, `concurrency` at a time; the records in the trace's order."""
    import httpx

    records: list[Record | None] = [None] * len(prompts)
    position = iter(range(len(prompts)))

    async def worker(client: httpx.AsyncClient) -> None:
        for i in position:
            records[i] = await post_prompt(client, url, model, prompts[i], origin)

    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return [r for r in records if r is not None]


async def probe_ttft(url: str, model: str, prompts: list[list[int]], stop: asyncio.Event) -> list[float]:
    """One user at a time, in order through `prompts`, until `stop`: each request's time to its first token
    (`max_tokens` 1, so the whole answer is the first token), in milliseconds; failed requests are left out."""
    import httpx

    ttft_ms = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        for prompt in prompts:
            if stop.is_set():
                break
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
            started = time.monotonic()
            try:
                r = await client.post(url + "/v1/completions", json=body)
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
                continue
            if r.status_code == 200:
                ttft_ms.append((time.monotonic() - started) * 1000.0)
    return ttft_ms


def warmup_tokens_in(metrics_text: str) -> int:
    """The router's warm-up prompt tokens in its /metrics text, over every event label (0 if none yet)."""
    from pagedinfer.contracts import metric_names as m

    sample = m.ROUTER_WARMUP_PROMPT_TOKENS.sample + "{"
    return round(sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics_text.splitlines() if ln.startswith(sample)))


async def router_warmup_tokens(url: str) -> int:
    import httpx

    async with httpx.AsyncClient(timeout=10.0) as client:
        return warmup_tokens_in((await client.get(url + "/metrics")).text)


def hit_rate(records: list[Record]) -> float:
    prompt = sum(r.prompt_tokens for r in records if r.ok)
    return sum(r.cached_tokens for r in records if r.ok) / prompt if prompt else 0.0


def summarize_trace(scenario: str, mode: str, before: list[Record], after: list[Record]) -> TraceResult:
    ok = [r for r in after if r.ok]
    quarter = [r for r in after[: max(1, len(after) // 4)] if r.ok]
    return TraceResult(
        scenario,
        mode,
        hit_rate(before[len(before) // 2 :]),
        len(after),
        sum(r.prompt_tokens for r in ok),
        sum(r.prompt_tokens - r.cached_tokens for r in ok),
        sum(r.prompt_tokens - r.cached_tokens for r in quarter),
        sum(1 for r in after if not r.ok),
    )


def trace_table(results: list[TraceResult]) -> str:
    lines = [
        "| event | mode | hit rate before | requests after | recomputed prefill tokens | of them in the first"
        " quarter | hit rate after | aborted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        after = 1.0 - r.recomputed_tokens / r.prompt_tokens if r.prompt_tokens else 0.0
        lines.append(
            f"| {r.scenario} | {r.mode} | {r.hit_rate_before:.1%} | {r.requests} | {r.recomputed_tokens:,} |"
            f" {r.recomputed_first_quarter:,} | {after:.1%} | {r.aborted} |"
        )
    return "\n".join(lines)
