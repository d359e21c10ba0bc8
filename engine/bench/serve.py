"""`pagedinfer bench serve`: load a running server and report what clients experience.

Each request is a streamed chat completion (`stream_options.include_usage`),
timed on the client: TTFT is the time to the first chunk carrying content,
ITL the gaps between later content chunks, E2E the time to [DONE]. The
prefix-cache hit rate comes from the server's own counters
(`pagedinfer_prefix_cache_hits_total / pagedinfer_prefix_cache_queries_total`),
scraped before and after the run, so only this run's traffic counts.

Before any load, one GET /v1/models checks that the server answers; when it
does not (nothing listening, not HTTP, a refused key) the run stops with a
ValueError naming the flag to fix (`--url`, `--api-key`), which the CLI
prints as one line and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from typing import Any

from pagedinfer.contracts import metric_names
from pagedinfer.engine.bench.scrape import sample_totals
from pagedinfer.engine.bench.workload import (
    RequestResult,
    ScheduledChatRequest,
    build_workload,
    format_summary,
    summarize,
)

PROBE_TIMEOUT_SECONDS = 10.0


async def _scrape(http: Any, url: str) -> tuple[float | None, float | None]:
    """The server's prefix-cache (queries, hits) counters; (None, None) when it has no Prometheus /metrics."""
    queries, hits = metric_names.PREFIX_CACHE_QUERIES.sample, metric_names.PREFIX_CACHE_HITS.sample
    try:
        totals = sample_totals((await http.get(url + "/metrics")).text, (queries, hits))
    except Exception:  # noqa: BLE001 - a server without /metrics still gets benchmarked
        return None, None
    return totals[queries], totals[hits]


async def _served_models(http: Any, url: str, headers: dict[str, str]) -> list[str]:
    """The ids /v1/models lists; ValueError naming the flag to fix when the server cannot be used."""
    import httpx

    try:
        r = await http.get(url + "/v1/models", headers=headers, timeout=PROBE_TIMEOUT_SECONDS)
    except httpx.HTTPError as exc:
        raise ValueError(f"--url: no server answers at {url} ({type(exc).__name__}: {exc})") from None
    if r.status_code == 401:
        raise ValueError(
            f"--api-key: the server at {url} refused the key (HTTP 401); pass --api-key or set PAGEDINFER_API_KEY"
        )
    if r.status_code != 200:
        raise ValueError(
            f"--url: GET {url}/v1/models answered HTTP {r.status_code}; is this an OpenAI-compatible server's base URL?"
        )
    try:
        return [card["id"] for card in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"--url: {url}/v1/models did not answer with an OpenAI model list") from None


async def _one(http: Any, url: str, model: str, req: ScheduledChatRequest, headers: dict[str, str]) -> RequestResult:
    messages = ([{"role": "system", "content": req.system_prompt}] if req.system_prompt else []) + [
        {"role": "user", "content": req.user_prompt}
    ]
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": req.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = None
    last = None
    gaps: list[float] = []
    usage: dict = {}
    try:
        async with http.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                return RequestResult(ok=False, error=f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return RequestResult(ok=False, error=chunk["error"].get("message"))
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - start
                    else:
                        gaps.append(now - last)
                    last = now
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash
        return RequestResult(ok=False, error=f"{type(exc).__name__}: {exc}")
    details = usage.get("prompt_tokens_details") or {}
    return RequestResult(
        ok=True,
        ttft_seconds=ttft,
        itl_seconds=tuple(gaps),
        latency_seconds=time.perf_counter() - start,
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        cached_tokens=details.get("cached_tokens", 0) or 0,
    )


async def run_bench(args: argparse.Namespace) -> tuple[Any, list[RequestResult]]:
    import httpx
    from tqdm import tqdm

    url = args.url.rstrip("/")
    key = args.api_key or os.environ.get("PAGEDINFER_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    workload = build_workload(
        args.dataset,
        args.num_prompts,
        args.request_rate,
        args.input_words,
        args.output_tokens,
        args.shared_prefix_words,
        args.seed,
    )
    limits = httpx.Limits(max_connections=args.max_concurrency or args.num_prompts + 8, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=args.timeout_seconds, limits=limits) as http:
        served = await _served_models(http, url, headers)
        if args.model is None and not served:
            raise ValueError(f"--model: the server at {url} lists no models; name one with --model")
        model = args.model or served[0]
        queries_before, hits_before = await _scrape(http, url)
        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        bar = tqdm(total=len(workload), desc="requests", unit="req", disable=args.no_progress, file=sys.stderr)
        start = time.perf_counter()

        async def timed(req: ScheduledChatRequest) -> RequestResult:
            delay = req.send_offset_seconds - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            if gate is None:
                result = await _one(http, url, model, req, headers)
            else:
                async with gate:
                    result = await _one(http, url, model, req, headers)
            bar.update(1)
            return result

        results = await asyncio.gather(*(timed(r) for r in workload))
        duration = time.perf_counter() - start
        bar.close()
        queries_after, hits_after = await _scrape(http, url)
    queries = None if queries_before is None or queries_after is None else queries_after - queries_before
    hits = None if hits_before is None or hits_after is None else hits_after - hits_before
    return summarize(results, duration, queries, hits), results


def main(args: argparse.Namespace) -> int:
    summary, results = asyncio.run(run_bench(args))
    print(format_summary(summary))
    failures = [r.error for r in results if not r.ok]
    if failures:
        print(f"first failure: {failures[0]}", file=sys.stderr)
    if args.json:
        print(json.dumps(dataclasses.asdict(summary)))
    return 0 if summary.num_ok else 1
