"""The autoscaler's rounds as the API server sees them, so tests count intervals, not seconds.

Every round of the autoscaler daemon (operator/autoscaling/daemon.py)
starts with one LIST of the InferenceService's pods and, before it sleeps,
has written `status.autoscaling` when that differs from what it last wrote
(the metric values it saw, its desiredReplicas). So at the pods LIST that
starts round k, the stored `status.autoscaling` is exactly what round k-1
saw and decided - also for rounds that wrote nothing because nothing
changed, which a history of writes would miss.

`AutoscalerRounds` is installed as the emulator's per-request hook (it
chains any authorizer already there and never denies) and keeps one `Round`
per pods LIST in the namespace from the first one that finds a status. No
other part of the operator lists pods, so `rounds[i]` is one interval after
`rounds[i - 1]`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock

from pagedinfer.testing.kube_emulator import Access, KubeEmulator

ISVC = kmock.resource("serving.pagedinfer.dev", "v1alpha1", "inferenceservices")


@dataclass(frozen=True)
class Round:
    """What one autoscaler round saw (mean metric values over ready pods; None: no data) and decided."""

    metrics: Mapping[str, float | None]
    desired_replicas: int


@dataclass
class AutoscalerRounds:
    emulator: KubeEmulator
    namespace: str
    name: str
    rounds: list[Round] = field(default_factory=list)
    _chained: Callable[[Access], bool] | None = None

    def install(self) -> AutoscalerRounds:
        self._chained, self.emulator.authorizer = self.emulator.authorizer, self
        return self

    def __call__(self, access: Access) -> bool:
        if access.verb == "list" and access.resource == "pods" and access.namespace == self.namespace:
            body = self.emulator.read(ISVC, self.namespace, self.name) or {}
            status: dict[str, Any] = (body.get("status") or {}).get("autoscaling") or {}
            if "desiredReplicas" in status:
                metrics = {m["name"]: m.get("value") for m in status.get("currentMetrics") or []}
                self.rounds.append(Round(metrics, int(status["desiredReplicas"])))
        return self._chained is None or self._chained(access)

    def first(self, predicate: Callable[[Round], bool]) -> int | None:
        """The index of the first round for which `predicate` holds; None if none does."""
        return next((i for i, r in enumerate(self.rounds) if predicate(r)), None)
