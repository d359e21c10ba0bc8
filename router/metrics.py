"""The router's /metrics: decisions by reason and engine, engine health and cached blocks, retries, the hold
queue's length and oldest wait."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily

from pagedinfer.contracts import metric_names as m


class _EngineCollector:
    def __init__(self, state) -> None:
        self.state = state

    def collect(self):
        healthy = GaugeMetricFamily(m.ROUTER_ENGINE_HEALTHY.name, "1 if the engine passes /health.", labels=["engine"])
        blocks = GaugeMetricFamily(
            m.ROUTER_ENGINE_CACHED_BLOCKS.name, "Prefix blocks the engine holds, per its KV events.", labels=["engine"]
        )
        inflight = GaugeMetricFamily(
            m.ROUTER_ENGINE_INFLIGHT_REQUESTS.name, "Requests sent to the engine and not finished.", labels=["engine"]
        )
        stale = GaugeMetricFamily(
            m.ROUTER_ENGINE_KV_STALE.name,
            "1 while the engine's KV events are silent past its heartbeats: its blocks are not scored.",
            labels=["engine"],
        )
        sequence = GaugeMetricFamily(
            m.ROUTER_ENGINE_KV_SEQUENCE.name,
            "The newest KV-event batch the router's view of the engine reflects (-1: none yet).",
            labels=["engine"],
        )
        for e in self.state.engines.values():
            healthy.add_metric([e.url], float(e.healthy))
            blocks.add_metric([e.url], float(len(e.hashes)))
            inflight.add_metric([e.url], float(e.num_inflight))
            stale.add_metric([e.url], float(e.kv_stale))
            sequence.add_metric([e.url], float(-1 if e.kv_seq is None else e.kv_seq))
        yield healthy
        yield blocks
        yield inflight
        yield stale
        yield sequence


class _HoldCollector:
    def __init__(self, hold) -> None:
        self.hold = hold

    def collect(self):
        length = GaugeMetricFamily(
            m.ROUTER_QUEUE_LENGTH.name,
            "Requests held in the router's queue, waiting for a ready engine.",
            value=float(len(self.hold)),
        )
        oldest = GaugeMetricFamily(
            m.ROUTER_QUEUE_OLDEST_WAIT_SECONDS.name,
            "How long the oldest held request has waited (0 with none held).",
            value=self.hold.oldest_wait_seconds(),
        )
        yield length
        yield oldest


class RouterMetrics:
    def __init__(self, state, hold) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(state))
        self.registry.register(_HoldCollector(hold))
        self.decisions = Counter(
            m.ROUTER_DECISIONS.name,
            "Routing decisions, by reason and engine.",
            ["reason", "engine"],
            registry=self.registry,
        )
        self.retries = Counter(
            m.ROUTER_RETRIES.name, "Requests retried on another engine before any byte.", registry=self.registry
        )
        self.warmup_tokens = Counter(
            m.ROUTER_WARMUP_PROMPT_TOKENS.name,
            "Prompt tokens replayed to warm engines, by event (new-engine, hand-off).",
            ["event"],
            registry=self.registry,
        )
        self.matched_tokens = Counter(
            m.ROUTER_MATCHED_PROMPT_TOKENS.name,
            "Prompt tokens cached on the chosen engine at decision time.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
