"""Reading the engines' metrics over HTTP (the I/O edge of the autoscaler).

Two sources, one result shape (pod name -> what was read, None = failed):

- direct: GET each ready pod's /metrics with aiohttp, at most `concurrency`
  at a time, each bounded by `timeout_seconds` and by a response size cap,
  and parse it (autoscaling_metrics.parse_pod_metrics). A timeout, a refused
  connection, a non-200 answer, an oversized body or garbage text fails that
  pod only; the error is logged and never raised.
- prometheus: instant queries against the Prometheus HTTP API
  (`/api/v1/query`) for the same series, selected by the `namespace` and
  `pod` labels that the usual Kubernetes scrape configuration attaches; the
  hit-rate counters come as `increase(...[window])`, so Prometheus does the
  reset handling. A failed query fails every pod.

  Each query is `max by (pod) (...)`: one engine can be scraped twice (the
  chart's PodMonitor and a `prometheus.io/scrape` annotation job), which gives
  two series of the same pod differing only in `job`/`instance`. Both carry
  the same reading, so the largest is the reading; summing them would double
  the KV usage and the waiting count.

The router's queue (the idle rule, autoscaling.idle) is always read from the
router pods directly (`scrape_router_queue`), whatever the source: a
Prometheus sample is up to a scrape interval old, and a request queued in
that gap must never count as "nothing queued".
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from pagedinfer.contracts import validators
from pagedinfer.operator.autoscaling.readings import (
    HITS_SERIES,
    KV_USAGE_SERIES,
    QUERIES_SERIES,
    RUNNING_SERIES,
    SLEEPING_SERIES,
    WAITING_SERIES,
    MetricsParseError,
    PodReading,
    PodScrape,
    parse_pod_metrics,
    parse_router_queue_length,
)

logger = logging.getLogger(__name__)

MAX_METRICS_BYTES = 4 << 20
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True)
class PodTarget:
    """A ready pod and the URL of its engine's /metrics."""

    name: str
    metrics_url: str

    def __post_init__(self) -> None:
        if not self.metrics_url.startswith(("http://", "https://")):
            raise ValueError(f"metrics_url must be an http(s) URL, got {self.metrics_url!r}")


async def scrape_pods(
    session: aiohttp.ClientSession,
    targets: Sequence[PodTarget],
    timeout_seconds: float,
    concurrency: int,
    model_name: str | None = None,
) -> dict[str, PodScrape | None]:
    """Scrape every target; a pod whose scrape fails maps to None."""
    validators.positive_seconds("timeout_seconds", timeout_seconds)
    validators.positive_int("concurrency", concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def one(target: PodTarget) -> PodScrape | None:
        async with gate:
            try:
                text = await asyncio.wait_for(_get_text(session, target.metrics_url), timeout_seconds)
                return parse_pod_metrics(text, model_name)
            except (TimeoutError, aiohttp.ClientError, MetricsParseError, UnicodeDecodeError, OSError) as e:
                logger.warning("scrape of pod %s failed: %s", target.name, _describe(e))
                return None

    results = await asyncio.gather(*(one(t) for t in targets))
    return {t.name: r for t, r in zip(targets, results)}


async def scrape_router_queue(
    session: aiohttp.ClientSession, targets: Sequence[PodTarget], timeout_seconds: float
) -> int | None:
    """Requests held by all the router pods together; None when there is no pod to read, or any one
    could not be read or does not export its queue (unknown is never "nothing queued")."""
    if not targets:
        return None
    total = 0
    for target in targets:
        try:
            text = await asyncio.wait_for(_get_text(session, target.metrics_url), timeout_seconds)
            queued = parse_router_queue_length(text)
        except (TimeoutError, aiohttp.ClientError, MetricsParseError, UnicodeDecodeError, OSError) as e:
            logger.warning("scrape of router pod %s failed: %s", target.name, _describe(e))
            return None
        if queued is None:
            logger.warning("router pod %s exports no queue length", target.name)
            return None
        total += queued
    return total


async def _get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url, allow_redirects=False) as response:
        if response.status != 200:
            raise aiohttp.ClientResponseError(
                response.request_info, (), status=response.status, message=f"HTTP {response.status}"
            )
        body = bytearray()
        async for chunk in response.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > MAX_METRICS_BYTES:
                raise MetricsParseError(f"body larger than {MAX_METRICS_BYTES} bytes")
        return body.decode("utf-8")


def _describe(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    return f"{type(e).__name__}: {e}"


async def query_prometheus(
    session: aiohttp.ClientSession,
    base_url: str,
    namespace: str,
    pod_names: Sequence[str],
    window_seconds: float,
    timeout_seconds: float,
    with_idle: bool = False,
) -> dict[str, PodReading | None]:
    """Per-pod readings from a Prometheus server; every pod None if any query fails.
    `with_idle`: also the running requests and the sleep gauge (the idle rule's)."""
    selector = pod_selector(namespace, pod_names)
    if not pod_names:
        return {}
    window = f"[{max(1, round(window_seconds))}s]"
    queries = {
        "kv": f"max by (pod) ({KV_USAGE_SERIES}{selector})",
        "waiting": f"max by (pod) ({WAITING_SERIES}{selector})",
        "queries": f"max by (pod) (increase({QUERIES_SERIES}{selector}{window}))",
        "hits": f"max by (pod) (increase({HITS_SERIES}{selector}{window}))",
    }
    if with_idle:
        queries["running"] = f"max by (pod) ({RUNNING_SERIES}{selector})"
        queries["sleeping"] = f"max by (pod) ({SLEEPING_SERIES}{selector})"
    try:
        results = {
            key: await asyncio.wait_for(_instant_query(session, base_url, q), timeout_seconds)
            for key, q in queries.items()
        }
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError, IndexError, OSError) as e:
        logger.warning("prometheus query at %s failed: %s", base_url, _describe(e))
        return {p: None for p in pod_names}
    readings = {}
    for pod in pod_names:
        queried, hit = results["queries"].get(pod), results["hits"].get(pod)
        if queried is None or hit is None:
            queried = hit = None
        readings[pod] = PodReading(
            results["kv"].get(pod),
            results["waiting"].get(pod),
            queried,
            hit,
            results.get("running", {}).get(pod),
            results.get("sleeping", {}).get(pod),
        )
    return readings


def pod_selector(namespace: str, pod_names: Sequence[str]) -> str:
    r"""The PromQL label selector `{namespace="ns",pod=~"a|b\\.c"}` for these pods.

    Every name must be a DNS-1123 name (ValueError otherwise), so nothing in it
    can end the string or the selector, and `.` is the only character a regex
    reads specially. It is escaped as the regex `\.`, which inside a PromQL
    double-quoted string is written `\\.`: PromQL strings take Go's escapes
    only, so `\-` (what re.escape writes for `-`) is an "unknown escape
    sequence" and Prometheus refuses the whole query.
    """
    for name in (namespace, *pod_names):
        if not _DNS_NAME.fullmatch(name):
            raise ValueError(f"pod and namespace names must be DNS names, got {name!r}")
    regex = "|".join(p.replace(".", "\\.") for p in pod_names)
    regex_in_string = regex.replace("\\", "\\\\")
    return f'{{namespace="{namespace}",pod=~"{regex_in_string}"}}'


async def _instant_query(session: aiohttp.ClientSession, base_url: str, query: str) -> Mapping[str, float]:
    """pod -> value of an instant vector query aggregated `by (pod)` (a repeated pod keeps its largest value)."""
    url = base_url.rstrip("/") + "/api/v1/query"
    async with session.get(url, params={"query": query}, allow_redirects=False) as response:
        if response.status != 200:
            raise ValueError(f"HTTP {response.status} from {url}")
        body = await response.json(content_type=None)
    if not isinstance(body, dict) or body.get("status") != "success":
        raise ValueError(f"query failed: {str(body)[:200]}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected a vector result, got {data.get('resultType')!r}")
    per_pod: dict[str, float] = {}
    for series in data.get("result", []):
        pod = (series.get("metric") or {}).get("pod")
        value = float(series["value"][1])
        if pod is None or not value >= 0 or value == float("inf"):
            continue
        per_pod[pod] = max(per_pod.get(pod, 0.0), value)
    return per_pod
