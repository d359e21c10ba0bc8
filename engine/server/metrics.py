"""Prometheus metrics of one server (names: contracts/metric_names.py, the contract in docs/design.md).

Two sources, two mechanisms:
- Engine state (`EngineStats`: KV pool, queues, cumulative token and cache
  counters) is exported by a custom collector from the latest snapshot the
  engine loop published. Gauges are the snapshot; counters are the engine's
  own cumulative totals, so `rate(pagedinfer_prefix_cache_hits_total[1m]) /
  rate(pagedinfer_prefix_cache_queries_total[1m])` is the hit rate (a query
  per request, at its first admission: a recompute after preemption is
  counted in the `prefix_cache_preempted_*` counters instead). The queue
  gauges count requests (one per prompt), not sequences.
- Per-request latencies (histograms) and finished-request counts are observed
  from the engine thread as outputs arrive: time to first token, inter-token
  latency (the time between two outputs that added tokens), end-to-end
  latency and queue time, from `RequestOutput.metrics` (monotonic seconds).

Every series carries `model_name`. Each server has its own registry, so
several servers in one process (tests) never share series. Every label value
of the request series (the histograms, and `request_success_total` for each
finish reason) exists at 0 from the start, as vLLM does, so dashboards and
`rate()` see them before the first request finishes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pagedinfer.contracts import metric_names as m
from pagedinfer.contracts.http.warmup_requests import is_warmup_request_id

FINISHED_REASONS = ("stop", "length", "abort")
TIER_DIRECTIONS = ("device_to_host", "host_to_device")  # engine/kv_offload/tier.py: STORE, LOAD
TTFT_BUCKETS_SECONDS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS_SECONDS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
E2E_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

_GAUGES = (
    (m.KV_CACHE_NUM_BLOCKS, "num_total_blocks", "KV cache blocks in the pool."),
    (m.KV_CACHE_USED_BLOCKS, "num_used_blocks", "KV cache blocks held by requests."),
    (m.KV_CACHE_FREE_BLOCKS, "num_free_blocks", "KV cache blocks not held by any request."),
    (
        m.KV_CACHE_CACHED_BLOCKS,
        "num_cached_free_blocks",
        "Free KV cache blocks that still hold a reusable prefix (evictable).",
    ),
    (m.KV_CACHE_USAGE_RATIO, "kv_usage", "Used KV cache blocks / total blocks (0-1)."),
    (
        m.NUM_REQUESTS_RUNNING,
        "num_running_reqs",
        "Requests with a sequence in the running batch (one per prompt: n completions count once).",
    ),
    (
        m.NUM_REQUESTS_WAITING,
        "num_waiting_reqs",
        "Requests waiting to be scheduled, none of their sequences running or swapped (n completions count once).",
    ),
    (
        m.NUM_REQUESTS_SWAPPED,
        "num_swapped_reqs",
        "Requests with a sequence swapped out to host memory and none running.",
    ),
    (
        m.KV_OFFLOAD_NUM_BLOCKS,
        "kv_offload_num_blocks",
        "Host blocks the prefix cache's tier may fill (the host pool, shared with the swap space; 0: off).",
    ),
    (m.KV_OFFLOAD_CACHED_BLOCKS, "kv_offload_cached_blocks", "Blocks the prefix cache's host tier holds."),
    (m.KV_OFFLOAD_USAGE_RATIO, "kv_offload_usage", "Host tier blocks held / the blocks it may fill (0-1)."),
)
_COUNTERS = (
    (
        m.PREFIX_CACHE_QUERIES,
        "prefix_cache_query_tokens",
        "Prompt tokens looked up in the prefix cache, once per request at its first admission.",
    ),
    (m.PREFIX_CACHE_HITS, "prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache."),
    (
        m.PREFIX_CACHE_PREEMPTED_QUERIES,
        "prefix_cache_preempted_query_tokens",
        "Tokens of recompute-preempted requests looked up again when re-admitted (not in prefix_cache_queries).",
    ),
    (
        m.PREFIX_CACHE_PREEMPTED_HITS,
        "prefix_cache_preempted_hit_tokens",
        "Of those, tokens found in the cache: recomputation saved, not prompt-cache hits.",
    ),
    (
        m.KV_CACHE_ALLOCATION_FAILURES,
        "num_allocation_failures",
        "Times a request could not get the KV blocks it needed.",
    ),
    (
        m.PREFIX_CACHE_OFFLOAD_HITS,
        "prefix_cache_offload_hit_tokens",
        "Of the prefix cache hits, prompt tokens loaded back from the host tier instead of recomputed.",
    ),
    (m.PROMPT_TOKENS, "num_prompt_tokens", "Prompt tokens processed (prefilled)."),
    (m.GENERATION_TOKENS, "num_generation_tokens", "Tokens generated."),
)


class _EngineStatsCollector:
    """Exports the latest EngineStats snapshot (gauges and cumulative counters)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: Any = None

    def collect(self) -> Iterable[Any]:
        stats = self.stats
        if stats is None:
            return
        labels = [self.model_name]
        for metric, field, doc in _GAUGES:
            family = GaugeMetricFamily(metric.name, doc, labels=["model_name"])
            family.add_metric(labels, float(getattr(stats, field)))
            yield family
        for metric, field, doc in _COUNTERS:
            family = CounterMetricFamily(metric.name, doc, labels=["model_name"])
            family.add_metric(labels, float(getattr(stats, field)))
            yield family
        preemptions = CounterMetricFamily(
            m.NUM_PREEMPTIONS.name, "Requests preempted, by mode.", labels=["model_name", "mode"]
        )
        for mode in sorted(set(stats.num_preemptions) | {"recompute", "swap"}):
            preemptions.add_metric(labels + [mode], float(stats.num_preemptions.get(mode, 0)))
        yield preemptions
        for metric, values, doc in (
            (m.KV_OFFLOAD_BYTES, stats.kv_offload_bytes, "Bytes copied between the KV pool and its host tier."),
            (
                m.KV_OFFLOAD_COPY_SECONDS,
                stats.kv_offload_copy_seconds,
                "Time spent copying between the KV pool and its host tier.",
            ),
        ):
            family = CounterMetricFamily(metric.name, doc, labels=["model_name", "direction"])
            for direction in TIER_DIRECTIONS:
                family.add_metric(labels + [direction], float(values.get(direction, 0)))
            yield family


class ServerMetrics:
    """The server's registry plus the observer interface the engine loop calls."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._engine = _EngineStatsCollector(model_name)
        self.registry.register(self._engine)
        labels = ["model_name"]
        self.ttft = Histogram(
            m.TIME_TO_FIRST_TOKEN_SECONDS.name,
            "Time from arrival to the first token.",
            labels,
            buckets=TTFT_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.itl = Histogram(
            m.INTER_TOKEN_LATENCY_SECONDS.name,
            "Time between two steps that added tokens.",
            labels,
            buckets=ITL_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            m.E2E_REQUEST_LATENCY_SECONDS.name,
            "Time from arrival to finish.",
            labels,
            buckets=E2E_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.queue_time = Histogram(
            m.REQUEST_QUEUE_TIME_SECONDS.name,
            "Time from arrival to first being scheduled.",
            labels,
            buckets=TTFT_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.success = Counter(
            m.REQUEST_SUCCESS.name,
            "Finished requests, by finish reason.",
            labels + ["finished_reason"],
            registry=self.registry,
        )
        self.warmups = Counter(
            m.WARMUP_REQUESTS.name,
            "A router's warm-up prefills, finished (not in the request series).",
            labels,
            registry=self.registry,
        )
        self.warmups.labels(model_name)
        self.cache_config = Info(m.CACHE_CONFIG.name, "KV cache configuration.", labels, registry=self.registry)
        self.sleeping = Gauge(
            m.ENGINE_SLEEPING.name,
            "1 while the engine is asleep (POST /sleep), else 0.",
            labels,
            registry=self.registry,
        )
        self.sleeping.labels(model_name).set(0)
        for histogram in (self.ttft, self.itl, self.e2e, self.queue_time):
            histogram.labels(model_name)
        for reason in FINISHED_REASONS:
            self.success.labels(model_name, reason)
        self._lock = threading.Lock()
        self._progress: dict[str, tuple[int, float]] = {}  # request id -> (num tokens seen, time seen)

    def watch_sleeping(self, sleeping: Callable[[], bool]) -> None:
        """The sleeping gauge reads `sleeping()` at each scrape."""
        self.sleeping.labels(self.model_name).set_function(lambda: float(sleeping()))

    # ---- observer interface (engine thread) ----
    def on_ready(self, info: Any) -> None:
        self.cache_config.labels(self.model_name).info(
            {
                "block_size": str(info.block_size),
                "num_gpu_blocks": str(info.num_gpu_blocks),
                "gpu_memory_utilization": str(info.gpu_memory_utilization),
                "enable_prefix_caching": str(info.enable_prefix_caching).lower(),
            }
        )

    def on_stats(self, stats: Any) -> None:
        self._engine.stats = stats

    def on_outputs(self, outputs: list[Any]) -> None:
        now = time.monotonic()
        with self._lock:
            for output in outputs:
                self._observe(output, now)

    def on_abort(self, request_id: str) -> None:
        with self._lock:
            self._progress.pop(request_id, None)
        if is_warmup_request_id(request_id):
            return
        self.success.labels(self.model_name, "abort").inc()

    def _observe(self, output: Any, now: float) -> None:
        """One step's RequestOutputDelta of a request: its new tokens advance the request's progress."""
        if is_warmup_request_id(output.request_id):
            if output.finished:
                self.warmups.labels(self.model_name).inc()
            return
        seen_tokens, seen_time = self._progress.get(output.request_id, (0, None))
        num_tokens = seen_tokens + sum(len(c.new_token_ids) for c in output.outputs)
        timing = output.metrics
        arrival = getattr(timing, "arrival_time", None)
        if num_tokens > seen_tokens:
            if seen_tokens == 0 and arrival is not None:
                first = getattr(timing, "first_token_time", None) or now
                self.ttft.labels(self.model_name).observe(max(0.0, first - arrival))
            elif seen_time is not None:
                self.itl.labels(self.model_name).observe(max(0.0, now - seen_time))
            self._progress[output.request_id] = (num_tokens, now)
        if not output.finished:
            return
        self._progress.pop(output.request_id, None)
        reasons = [c.finish_reason for c in output.outputs if c.finish_reason is not None]
        if "abort" in reasons:
            return  # counted by on_abort
        reason = "length" if "length" in reasons else "stop"
        self.success.labels(self.model_name, reason).inc()
        if arrival is not None:
            finished = getattr(timing, "finished_time", None) or now
            self.e2e.labels(self.model_name).observe(max(0.0, finished - arrival))
            scheduled = getattr(timing, "first_scheduled_time", None)
            if scheduled is not None:
                self.queue_time.labels(self.model_name).observe(max(0.0, scheduled - arrival))

    def render(self) -> bytes:
        return generate_latest(self.registry)
