"""The operator's own Prometheus metrics (reconciles, errors, durations, API calls).

Each `OperatorMetrics` has its own CollectorRegistry, so several operators in
one process (tests) never share counters. `pagedinfer operator --metrics-port`
serves it over HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from pagedinfer.contracts import metric_names as m

RESULTS = ("applied", "invalid", "unsized", "retry")


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.reconciles = Counter(
            m.OPERATOR_RECONCILES.name,
            "InferenceService reconciles by result (applied, invalid, unsized, retry).",
            ["result"],
            registry=self.registry,
        )
        self.errors = Counter(
            m.OPERATOR_RECONCILE_ERRORS.name,
            "Reconciles that ended in an error to retry, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.duration = Histogram(
            m.OPERATOR_RECONCILE_DURATION_SECONDS.name,
            "Wall time of one InferenceService reconcile.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.api_requests = Counter(
            m.OPERATOR_API_REQUESTS.name,
            "Kubernetes API requests made by the operator's handlers (not kopf's own watches and patches).",
            registry=self.registry,
        )
        for result in RESULTS:
            self.reconciles.labels(result=result)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
