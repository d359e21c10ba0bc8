"""Operator configuration, runtime state, and the two activity handlers (startup, login).

`OperatorConfig` holds every knob (the CLI fills it from flags and env; tests
pass small timeouts). `Runtime` is what handlers share through kopf's memo
(`memo.pagedinfer`): the config, the API client built at login, the Hub
fetcher and the metrics. Nothing lives in module globals.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import kopf

from pagedinfer.contracts import validators
from pagedinfer.contracts.inference_service import API_GROUP
from pagedinfer.contracts.routing.lifecycle import WARMUP_GATE_TIMEOUT_SECONDS
from pagedinfer.operator.kube_api import KubeApi
from pagedinfer.operator.kv_plan.hub_config import HubConfigFetcher
from pagedinfer.operator.metrics import OperatorMetrics
from pagedinfer.operator.registry import REGISTRY
from pagedinfer.operator.spec.crd_model import DEFAULT_ROUTER_IMAGE, EngineImages


@dataclass(frozen=True)
class OperatorConfig:
    hf_endpoint: str = "https://huggingface.co"
    hf_token: str | None = field(default=None, repr=False)
    fetch_hf_config: bool = True  # False: hf:// models need architecture or configMapRef
    hf_timeout_seconds: float = 10.0
    api_timeout_seconds: float = 30.0
    retry_delay_seconds: float = 15.0  # after an API error
    # Waiting on the cluster: NoMatchingNodes, ModelConfigUnavailable, ChildConflict, QuotaExceeded.
    no_nodes_retry_seconds: float = 60.0
    watch_timeout_seconds: float = 300.0
    error_backoffs: tuple[float, ...] = (1, 2, 4, 8, 16)
    allow_host_path_models: bool = False  # file:// models as hostPath volumes (a privilege: off by default)
    # The router pods' image when spec.router.image is not set (images/router.Dockerfile; the chart sets it).
    router_image: str = DEFAULT_ROUTER_IMAGE
    # The engine pods' images when spec.engine.image is not set: GPU pods, and `gpus: 0` pods (the chart sets both).
    engine_images: EngineImages = EngineImages()
    # With no router pod ready, the operator opens an engine pod's warm-up readiness gate itself once its
    # containers have been ready this long (the router's own bound), checking every poll (routing/gate_fallback).
    warmup_gate_timeout_seconds: float = WARMUP_GATE_TIMEOUT_SECONDS
    warmup_gate_poll_seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in (
            "hf_timeout_seconds",
            "api_timeout_seconds",
            "retry_delay_seconds",
            "no_nodes_retry_seconds",
            "watch_timeout_seconds",
            "warmup_gate_timeout_seconds",
            "warmup_gate_poll_seconds",
        ):
            validators.positive_seconds(name, getattr(self, name))

    @classmethod
    def from_env(cls, **overrides: Any) -> OperatorConfig:
        env = os.environ
        values: dict[str, Any] = {
            "hf_endpoint": env.get("PAGEDINFER_HF_ENDPOINT", env.get("HF_ENDPOINT", cls.hf_endpoint)),
            "hf_token": env.get("HF_TOKEN") or None,
            "router_image": env.get("PAGEDINFER_ROUTER_IMAGE") or cls.router_image,
        }
        engine_image = overrides.pop("engine_image", None) or env.get("PAGEDINFER_ENGINE_IMAGE")
        engine_cpu_image = overrides.pop("engine_cpu_image", None) or env.get("PAGEDINFER_ENGINE_CPU_IMAGE")
        values["engine_images"] = EngineImages(
            gpu=engine_image or EngineImages.gpu, cpu=engine_cpu_image or EngineImages.cpu
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class Runtime:
    config: OperatorConfig
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    api: KubeApi | None = None
    fetcher: HubConfigFetcher | None = None
    # Child uid -> drift.fingerprint of the child as the operator last applied or saw it:
    # a child event with another fingerprint is someone else's edit (reconciler, child_events).
    child_fingerprints: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fetcher is None:
            self.fetcher = HubConfigFetcher(
                endpoint=self.config.hf_endpoint,
                token=self.config.hf_token,
                timeout_seconds=self.config.hf_timeout_seconds,
            )

    @property
    def kube(self) -> KubeApi:
        if self.api is None:
            raise kopf.TemporaryError("not logged in to the Kubernetes API yet", delay=1)
        return self.api

    async def connect(self, info: kopf.ConnectionInfo) -> None:
        old, self.api = self.api, KubeApi(info, timeout_seconds=self.config.api_timeout_seconds)
        if old is not None:
            await old.close()

    async def close(self) -> None:
        if self.api is not None:
            await self.api.close()


def runtime_of(memo: Any) -> Runtime:
    runtime = getattr(memo, "pagedinfer", None)
    if not isinstance(runtime, Runtime):
        raise kopf.PermanentError("the operator was started without its runtime (memo.pagedinfer)")
    return runtime


@kopf.on.startup(registry=REGISTRY)
def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    config = runtime_of(memo).config
    # Progress and the last-handled spec go to annotations: the CRD's structural
    # schema would prune kopf's default `status.kopf` field.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    # Only warnings become Kubernetes Events; the reconciler posts its own for
    # InvalidSpec and InsufficientGPUMemory, with the numbers.
    settings.posting.level = logging.WARNING
    # The CRD is installed before the operator (the chart does it); not scanning
    # for CRDs means no cluster-wide CRD watch and so no RBAC for it.
    settings.scanning.disabled = True
    # Re-list periodically even if a watch silently stalls.
    settings.watching.server_timeout = config.watch_timeout_seconds
    settings.watching.client_timeout = config.watch_timeout_seconds + 10
    settings.networking.request_timeout = config.api_timeout_seconds
    # kopf's own API calls retry 5xx and timeouts with these pauses.
    settings.networking.error_backoffs = config.error_backoffs
    # Unexpected handler exceptions retry after this long (TemporaryError carries its own delay).
    settings.execution.default_backoff = config.retry_delay_seconds


@kopf.on.login(registry=REGISTRY)
async def login(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """In a pod, the service account; elsewhere, the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig: cannot reach the Kubernetes API")
    await runtime_of(memo).connect(info)
    return info


@kopf.on.cleanup(registry=REGISTRY)
async def close(memo: Any, **_: Any) -> None:
    await runtime_of(memo).close()
