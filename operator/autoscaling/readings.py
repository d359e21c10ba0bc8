"""From engine /metrics text to the per-metric samples the policy decides on.

Three pure steps:

1. `parse_pod_metrics(text)`: the Prometheus text exposition of one engine
   pod (parsed by prometheus_client.parser) to a `PodScrape`: the gauges
   `pagedinfer_kv_cache_usage_ratio`, `pagedinfer_num_requests_waiting`,
   `pagedinfer_num_requests_running` and `pagedinfer_engine_sleeping` (the
   last two for the idle rule, autoscaling.idle), and the cumulative counters `pagedinfer_prefix_cache_queries_total` and
   `pagedinfer_prefix_cache_hits_total` (tokens). Anything that is not valid
   exposition text raises MetricsParseError; NaN, infinite or negative values
   count as absent.
2. `pod_reading(previous, current)`: the interval's reading of one pod: the
   gauges as they are, the counters as deltas against the pod's previous
   scrape. A counter that went DOWN was reset (the engine restarted), and, as
   Prometheus' rate() does, its delta is then the new value itself. A pod seen
   for the first time has no deltas yet.
3. `aggregate(readings, ...)`: over the ready pods: kvCacheUsage and
   requestsWaiting are averages over the pods that report them; the hit rate
   is token-weighted, sum(hit deltas) / sum(query deltas), over the pods with
   at least one query token in the interval (a pod with none says nothing
   about thrashing). Pods whose scrape failed count as failed scrapes.
   `idle_counts(readings)` gives the idle rule's view of the same readings:
   requests running or waiting in all, and engines awake and asleep.

`parse_router_queue_length(text)` reads the router's /metrics: the requests
its hold queue holds (`pagedinfer_router_queue_length`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from pagedinfer.contracts import metric_names
from pagedinfer.operator.autoscaling.policy import MetricSample
from pagedinfer.operator.autoscaling.spec import KV_CACHE_USAGE, PREFIX_CACHE_HIT_RATE, REQUESTS_WAITING

KV_USAGE_SERIES = metric_names.KV_CACHE_USAGE_RATIO.sample
WAITING_SERIES = metric_names.NUM_REQUESTS_WAITING.sample
QUERIES_SERIES = metric_names.PREFIX_CACHE_QUERIES.sample
HITS_SERIES = metric_names.PREFIX_CACHE_HITS.sample
RUNNING_SERIES = metric_names.NUM_REQUESTS_RUNNING.sample
SLEEPING_SERIES = metric_names.ENGINE_SLEEPING.sample
ROUTER_QUEUE_SERIES = metric_names.ROUTER_QUEUE_LENGTH.sample
_WANTED = (KV_USAGE_SERIES, WAITING_SERIES, QUERIES_SERIES, HITS_SERIES, RUNNING_SERIES, SLEEPING_SERIES)


class MetricsParseError(ValueError):
    """The /metrics body is not Prometheus text exposition."""


@dataclass(frozen=True)
class PodScrape:
    """The series of one engine at one scrape; None where absent."""

    kv_cache_usage: float | None = None
    num_requests_waiting: float | None = None
    prefix_cache_query_tokens_total: float | None = None
    prefix_cache_hit_tokens_total: float | None = None
    num_requests_running: float | None = None
    sleeping: float | None = None  # 1 asleep, 0 awake; None: an engine without sleep mode (awake)


@dataclass(frozen=True)
class PodReading:
    """One pod over one interval: gauges now, counter deltas since its last scrape
    (None on a pod's first scrape or when the counters are absent)."""

    kv_cache_usage: float | None = None
    num_requests_waiting: float | None = None
    prefix_cache_query_tokens: float | None = None
    prefix_cache_hit_tokens: float | None = None
    num_requests_running: float | None = None
    sleeping: float | None = None


@dataclass(frozen=True)
class IdleCounts:
    """The idle rule's reading of the ready engines. `requests_in_flight` is None when a ready engine
    could not be read, or did not say how many requests it runs and queues."""

    requests_in_flight: int | None
    num_awake: int
    num_asleep: int


def _samples(text: str, wanted: tuple[str, ...], model_name: str | None) -> dict[str, list[float]]:
    """The values of each wanted sample name (those labelled `model_name` only, when given)."""
    values: dict[str, list[float]] = {name: [] for name in wanted}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in values:
                    continue
                if model_name is not None and sample.labels.get("model_name") != model_name:
                    continue
                values[sample.name].append(float(sample.value))
    except Exception as e:  # the parser raises ValueError, IndexError, ... on garbage
        raise MetricsParseError(f"not Prometheus text exposition: {e}") from None
    return values


def parse_pod_metrics(text: str, model_name: str | None = None) -> PodScrape:
    """Parse one pod's exposition text. With `model_name`, only series whose
    `model_name` label matches count; several matching series (one engine per
    pod makes that unusual) are averaged for gauges and summed for counters."""
    values = _samples(text, _WANTED, model_name)

    def gauge(name: str) -> float | None:
        good = [v for v in values[name] if math.isfinite(v) and v >= 0]
        return sum(good) / len(good) if good else None

    def counter(name: str) -> float | None:
        good = [v for v in values[name] if math.isfinite(v) and v >= 0]
        return sum(good) if good else None

    return PodScrape(
        kv_cache_usage=gauge(KV_USAGE_SERIES),
        num_requests_waiting=gauge(WAITING_SERIES),
        prefix_cache_query_tokens_total=counter(QUERIES_SERIES),
        prefix_cache_hit_tokens_total=counter(HITS_SERIES),
        num_requests_running=gauge(RUNNING_SERIES),
        sleeping=gauge(SLEEPING_SERIES),
    )


def parse_router_queue_length(text: str) -> int | None:
    """Requests held in one router's queue (the sum of its series), None when it does not export it."""
    values = [
        v for v in _samples(text, (ROUTER_QUEUE_SERIES,), None)[ROUTER_QUEUE_SERIES] if math.isfinite(v) and v >= 0
    ]
    return round(sum(values)) if values else None


def counter_delta(previous: float | None, current: float | None) -> float | None:
    """Increase of a cumulative counter; a decrease means a reset, so the
    increase since the reset is the current value."""
    if previous is None or current is None:
        return None
    return current - previous if current >= previous else current


def pod_reading(previous: PodScrape | None, current: PodScrape) -> PodReading:
    prev = previous or PodScrape()
    queries = counter_delta(prev.prefix_cache_query_tokens_total, current.prefix_cache_query_tokens_total)
    hits = counter_delta(prev.prefix_cache_hit_tokens_total, current.prefix_cache_hit_tokens_total)
    if queries is None or hits is None:
        queries = hits = None
    return PodReading(
        current.kv_cache_usage,
        current.num_requests_waiting,
        queries,
        hits,
        current.num_requests_running,
        current.sleeping,
    )


def idle_counts(readings: Mapping[str, PodReading | None]) -> IdleCounts:
    """Over the ready pods in `readings` (None = scrape failed): requests running or waiting in all
    (None if any pod is unread or reports neither gauge), and how many engines are awake / asleep."""
    in_flight: int | None = 0
    awake = asleep = 0
    for reading in readings.values():
        if reading is None or reading.num_requests_running is None or reading.num_requests_waiting is None:
            in_flight = None
        elif in_flight is not None:
            in_flight += round(reading.num_requests_running + reading.num_requests_waiting)
        if reading is not None and reading.sleeping:
            asleep += 1
        elif reading is not None:
            awake += 1
    return IdleCounts(in_flight, awake, asleep)


def aggregate(
    readings: Mapping[str, PodReading | None], metric_names: tuple[str, ...]
) -> tuple[dict[str, MetricSample], int]:
    """Per-metric samples over the ready pods in `readings` (None = scrape failed),
    and the number of failed scrapes."""
    ok = [r for r in readings.values() if r is not None]
    num_failed = len(readings) - len(ok)
    samples: dict[str, MetricSample] = {}
    for name in metric_names:
        if name == KV_CACHE_USAGE:
            samples[name] = _mean([r.kv_cache_usage for r in ok])
        elif name == REQUESTS_WAITING:
            samples[name] = _mean([r.num_requests_waiting for r in ok])
        elif name == PREFIX_CACHE_HIT_RATE:
            samples[name] = _hit_rate(ok)
        else:
            raise ValueError(f"metric_names: unknown metric {name!r}")
    return samples, num_failed


def _mean(values: list[float | None]) -> MetricSample:
    present = [v for v in values if v is not None]
    if not present:
        return MetricSample(None, 0)
    return MetricSample(sum(present) / len(present), len(present))


def _hit_rate(readings: list[PodReading]) -> MetricSample:
    active = [r for r in readings if r.prefix_cache_query_tokens and r.prefix_cache_hit_tokens is not None]
    if not active:
        return MetricSample(None, 0)
    queries = sum(r.prefix_cache_query_tokens for r in active)
    hits = sum(min(r.prefix_cache_hit_tokens, r.prefix_cache_query_tokens) for r in active)
    return MetricSample(hits / queries, len(active))
