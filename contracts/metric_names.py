"""Every Prometheus metric pagedinfer exposes, named once: the server's, the router's and the operator's.

The server, the router and the operator register these names; the
autoscaler, `pagedinfer bench serve` and bench/routing.py read them; the
chart's alerts and dashboard may query only these (tests/chart); docs/design.md
("Metrics") lists the server's. Plain constants and the standard library: the
operator and the router import this without torch (tests/test_packaging.py).

A `Metric.name` is the family name as prometheus_client takes it; the
exposition adds `_total` to a counter's sample, `_bucket`, `_sum` and `_count`
to a histogram's and `_info` to an info's (`Metric.series`). Readers of the
text look samples up by `Metric.sample` (gauges and counters).
"""

from __future__ import annotations

from dataclasses import dataclass

GAUGE, COUNTER, HISTOGRAM, INFO = "gauge", "counter", "histogram", "info"
_SUFFIXES = {GAUGE: ("",), COUNTER: ("_total",), HISTOGRAM: ("_bucket", "_sum", "_count"), INFO: ("_info",)}


@dataclass(frozen=True)
class Metric:
    """One metric family. Invariant: `name` has no `_total` or `_info` suffix (the exposition adds it)."""

    name: str
    kind: str  # GAUGE, COUNTER, HISTOGRAM or INFO

    def __post_init__(self) -> None:
        if self.kind not in _SUFFIXES:
            raise ValueError(f"kind: must be one of {sorted(_SUFFIXES)}, got {self.kind!r}")
        if self.name.endswith(("_total", "_info")):
            raise ValueError(f"name: {self.name!r} ends with the suffix the exposition adds")

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names this family has in the text exposition."""
        return tuple(self.name + suffix for suffix in _SUFFIXES[self.kind])

    @property
    def sample(self) -> str:
        """The one sample name of a gauge or counter (what a reader of /metrics looks up)."""
        if self.kind not in (GAUGE, COUNTER):
            raise ValueError(f"{self.name}: a {self.kind} has several sample names: {self.series}")
        return self.series[0]


PREFIX = "pagedinfer_"

# ---- the engine server (`pagedinfer serve`), every series labelled model_name ----
KV_CACHE_NUM_BLOCKS = Metric(PREFIX + "kv_cache_num_blocks", GAUGE)
KV_CACHE_USED_BLOCKS = Metric(PREFIX + "kv_cache_used_blocks", GAUGE)
KV_CACHE_FREE_BLOCKS = Metric(PREFIX + "kv_cache_free_blocks", GAUGE)
KV_CACHE_CACHED_BLOCKS = Metric(PREFIX + "kv_cache_cached_blocks", GAUGE)
KV_CACHE_USAGE_RATIO = Metric(PREFIX + "kv_cache_usage_ratio", GAUGE)
NUM_REQUESTS_RUNNING = Metric(PREFIX + "num_requests_running", GAUGE)
NUM_REQUESTS_WAITING = Metric(PREFIX + "num_requests_waiting", GAUGE)
NUM_REQUESTS_SWAPPED = Metric(PREFIX + "num_requests_swapped", GAUGE)
PREFIX_CACHE_QUERIES = Metric(PREFIX + "prefix_cache_queries", COUNTER)  # prompt tokens
PREFIX_CACHE_HITS = Metric(PREFIX + "prefix_cache_hits", COUNTER)  # prompt tokens
PREFIX_CACHE_PREEMPTED_QUERIES = Metric(PREFIX + "prefix_cache_preempted_queries", COUNTER)
PREFIX_CACHE_PREEMPTED_HITS = Metric(PREFIX + "prefix_cache_preempted_hits", COUNTER)
KV_CACHE_ALLOCATION_FAILURES = Metric(PREFIX + "kv_cache_allocation_failures", COUNTER)
PROMPT_TOKENS = Metric(PREFIX + "prompt_tokens", COUNTER)
GENERATION_TOKENS = Metric(PREFIX + "generation_tokens", COUNTER)
NUM_PREEMPTIONS = Metric(PREFIX + "num_preemptions", COUNTER)  # label mode
REQUEST_SUCCESS = Metric(PREFIX + "request_success", COUNTER)  # label finished_reason
TIME_TO_FIRST_TOKEN_SECONDS = Metric(PREFIX + "time_to_first_token_seconds", HISTOGRAM)
INTER_TOKEN_LATENCY_SECONDS = Metric(PREFIX + "inter_token_latency_seconds", HISTOGRAM)
E2E_REQUEST_LATENCY_SECONDS = Metric(PREFIX + "e2e_request_latency_seconds", HISTOGRAM)
REQUEST_QUEUE_TIME_SECONDS = Metric(PREFIX + "request_queue_time_seconds", HISTOGRAM)
CACHE_CONFIG = Metric(PREFIX + "cache_config", INFO)
SERVER = (
    KV_CACHE_NUM_BLOCKS,
    KV_CACHE_USED_BLOCKS,
    KV_CACHE_FREE_BLOCKS,
    KV_CACHE_CACHED_BLOCKS,
    KV_CACHE_USAGE_RATIO,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    NUM_REQUESTS_SWAPPED,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_PREEMPTED_QUERIES,
    PREFIX_CACHE_PREEMPTED_HITS,
    KV_CACHE_ALLOCATION_FAILURES,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    NUM_PREEMPTIONS,
    REQUEST_SUCCESS,
    TIME_TO_FIRST_TOKEN_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS,
    E2E_REQUEST_LATENCY_SECONDS,
    REQUEST_QUEUE_TIME_SECONDS,
    CACHE_CONFIG,
)
# the prefix cache's host tier (--kv-offloading-size, engine/kv_offload/); zero when it is off
PREFIX_CACHE_OFFLOAD_HITS = Metric(PREFIX + "prefix_cache_offload_hits", COUNTER)  # prompt tokens, of the hits
KV_OFFLOAD_NUM_BLOCKS = Metric(PREFIX + "kv_offload_num_blocks", GAUGE)  # host blocks the tier may fill
KV_OFFLOAD_CACHED_BLOCKS = Metric(PREFIX + "kv_offload_cached_blocks", GAUGE)  # tier entries now
KV_OFFLOAD_USAGE_RATIO = Metric(PREFIX + "kv_offload_usage_ratio", GAUGE)  # entries / blocks it may fill
KV_OFFLOAD_BYTES = Metric(PREFIX + "kv_offload_bytes", COUNTER)  # label direction
KV_OFFLOAD_COPY_SECONDS = Metric(PREFIX + "kv_offload_copy_seconds", COUNTER)  # label direction
SERVER += (
    PREFIX_CACHE_OFFLOAD_HITS,
    KV_OFFLOAD_NUM_BLOCKS,
    KV_OFFLOAD_CACHED_BLOCKS,
    KV_OFFLOAD_USAGE_RATIO,
    KV_OFFLOAD_BYTES,
    KV_OFFLOAD_COPY_SECONDS,
)
# sleep mode (POST /sleep, engine/sleep/)
ENGINE_SLEEPING = Metric(PREFIX + "engine_sleeping", GAUGE)  # 1 asleep, 0 awake
SERVER += (ENGINE_SLEEPING,)
# a router's warm-up prefills (x-pagedinfer-warmup: 1, contracts/http/warmup_requests.py), kept out of the request series
WARMUP_REQUESTS = Metric(PREFIX + "warmup_requests", COUNTER)
SERVER += (WARMUP_REQUESTS,)

# ---- the prefix-aware router (`pagedinfer router`) ----
ROUTER_ENGINE_HEALTHY = Metric(PREFIX + "router_engine_healthy", GAUGE)  # label engine
ROUTER_ENGINE_CACHED_BLOCKS = Metric(PREFIX + "router_engine_cached_blocks", GAUGE)  # label engine
ROUTER_ENGINE_INFLIGHT_REQUESTS = Metric(PREFIX + "router_engine_inflight_requests", GAUGE)  # label engine
ROUTER_DECISIONS = Metric(PREFIX + "router_decisions", COUNTER)  # labels reason, engine
ROUTER_RETRIES = Metric(PREFIX + "router_retries", COUNTER)
ROUTER_MATCHED_PROMPT_TOKENS = Metric(PREFIX + "router_matched_prompt_tokens", COUNTER)
ROUTER_QUEUE_LENGTH = Metric(PREFIX + "router_queue_length", GAUGE)  # requests held for a ready engine
ROUTER_QUEUE_OLDEST_WAIT_SECONDS = Metric(PREFIX + "router_queue_oldest_wait_seconds", GAUGE)
ROUTER_ENGINE_KV_STALE = Metric(PREFIX + "router_engine_kv_stale", GAUGE)  # label engine
ROUTER_ENGINE_KV_SEQUENCE = Metric(PREFIX + "router_engine_kv_sequence", GAUGE)  # label engine
ROUTER = (
    ROUTER_ENGINE_HEALTHY,
    ROUTER_ENGINE_CACHED_BLOCKS,
    ROUTER_ENGINE_INFLIGHT_REQUESTS,
    ROUTER_DECISIONS,
    ROUTER_RETRIES,
    ROUTER_MATCHED_PROMPT_TOKENS,
    ROUTER_QUEUE_LENGTH,
    ROUTER_QUEUE_OLDEST_WAIT_SECONDS,
    ROUTER_ENGINE_KV_STALE,
    ROUTER_ENGINE_KV_SEQUENCE,
)
ROUTER_WARMUP_PROMPT_TOKENS = Metric(PREFIX + "router_warmup_prompt_tokens", COUNTER)  # label event
ROUTER += (ROUTER_WARMUP_PROMPT_TOKENS,)

# ---- the operator (`pagedinfer operator --metrics-port`) ----
OPERATOR_RECONCILES = Metric(PREFIX + "operator_reconciles", COUNTER)  # label result
OPERATOR_RECONCILE_ERRORS = Metric(PREFIX + "operator_reconcile_errors", COUNTER)  # label reason
OPERATOR_RECONCILE_DURATION_SECONDS = Metric(PREFIX + "operator_reconcile_duration_seconds", HISTOGRAM)
OPERATOR_API_REQUESTS = Metric(PREFIX + "operator_api_requests", COUNTER)
OPERATOR = (OPERATOR_RECONCILES, OPERATOR_RECONCILE_ERRORS, OPERATOR_RECONCILE_DURATION_SECONDS, OPERATOR_API_REQUESTS)

ALL = SERVER + ROUTER + OPERATOR


def exposed_series(metrics: tuple[Metric, ...] = ALL) -> frozenset[str]:
    """Every sample name the given families put in the text exposition."""
    return frozenset(series for metric in metrics for series in metric.series)
