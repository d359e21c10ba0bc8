"""The InferenceService spec as frozen dataclasses, with the CRD's names and limits.

`parser.parse_spec` builds them from what a user applied and raises
`SpecError` listing every problem.

Defaults live here and in the CRD; the two are kept equal by a test.
`spec.autoscaling` is the autoscaler's `AutoscalingSpec`, validated by the same parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.config.options import field_default, managed_flags
from pagedinfer.contracts.config.serve_args import ServeArgs
from pagedinfer.operator.autoscaling.spec import AutoscalingSpec
from pagedinfer.operator.routing.spec import RouterSpec

# The engine pods' image unless spec.engine.image says otherwise: the CUDA image for a service with
# GPUs, the CPU image (CPU torch, the native CPU kernels prebuilt) for `gpus: 0` (operator
# --engine-image / --engine-cpu-image; the chart sets both).
DEFAULT_IMAGE = "ghcr.io/pagedinfer/pagedinfer:0.1.0"
DEFAULT_CPU_IMAGE = "ghcr.io/pagedinfer/pagedinfer:0.1.0-cpu"
# The router pods' image unless spec.router.image says otherwise (operator --router-image).
DEFAULT_ROUTER_IMAGE = "ghcr.io/pagedinfer/pagedinfer-router:0.1.0"
DTYPES = ("auto", "bfloat16", "float16", "float32")
MODEL_SCHEMES = ("hf", "pvc", "s3", "file")
# Flags the operator sets itself; extraArgs may neither repeat nor abbreviate them
# (parser.managed_flag_of; the CRD's CEL rule on extraArgs lists the same flags, a test
# keeps them equal). Derived from the options' one definition, the fields marked managed.
MANAGED_FLAGS = managed_flags(EngineConfig, ServeArgs)
RESERVED_ENV = ("PAGEDINFER_API_KEY", "HF_HOME", "HF_HUB_OFFLINE", "HOME")
# Set by the operator only when spec.model.hfTokenSecretRef is (env may set it otherwise).
HF_TOKEN_ENV = "HF_TOKEN"
# Longest name whose derived children (Deployment pods get a 16-char suffix) stay valid.
MAX_NAME_LENGTH = 47


# spec.engine.tensorParallelSize: one replica's ranks, one GPU each, all in one pod
# on one node (the pod requests N GPUs; spec.resources.gpus defaults to N and,
# when set to a GPU count, must equal it). Multi-node replicas are refused.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)


class SpecError(ValueError):
    """An invalid InferenceService; `problems` lists each one as 'path: what is wrong'."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class ModelUri:
    """A parsed `spec.model.uri`: scheme plus the parts the Deployment needs.

    hf://org/name     -> repo_id "org/name"
    pvc://claim/path  -> claim_name "claim", path "path" (inside the claim)
    file:///abs/path  -> path "/abs/path" (a directory on the node)
    s3://bucket/key   -> passed to the engine as is
    """

    raw: str
    scheme: str
    repo_id: str | None = None
    claim_name: str | None = None
    path: str | None = None


@dataclass(frozen=True)
class Architecture:
    """Inline model facts for sizing (`spec.model.architecture`)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_parameters: int
    hidden_size: int | None = None
    max_position_embeddings: int | None = None


@dataclass(frozen=True)
class ConfigMapRef:
    """A ConfigMap in the service's namespace holding the model's config.json."""

    name: str
    key: str = "config.json"


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class ModelSpec:
    uri: ModelUri | None  # None: the engine's embedded default model
    dtype: str = "auto"
    architecture: Architecture | None = None
    config_map_ref: ConfigMapRef | None = None
    revision: str = "main"  # hf:// only
    allow_download: bool = False  # hf:// only: False sets HF_HUB_OFFLINE=1 in the pod
    cache_claim_name: str | None = None  # None: an emptyDir model cache
    hf_token_secret_ref: SecretKeyRef | None = None  # hf:// only: the pod's HF_TOKEN, from this Secret


def _engine(name: str) -> Any:
    """The engine's own default of option `name` (EngineConfig), which the CRD's default equals (a test)."""
    return field_default(EngineConfig, name)


@dataclass(frozen=True)
class EngineImages:
    """The engine images the operator runs where spec.engine.image is unset, one per kind of pod."""

    gpu: str = DEFAULT_IMAGE  # spec.resources.gpus > 0: CUDA torch and the Triton kernels
    cpu: str = DEFAULT_CPU_IMAGE  # gpus: 0: CPU torch and the native CPU kernels, prebuilt

    def for_gpus(self, gpus: int) -> str:
        return self.gpu if gpus > 0 else self.cpu


@dataclass(frozen=True)
class KVOffloadSpec:
    """spec.engine.kvOffload: the host tier's size per rank, in bytes, or as a fraction of the node's memory."""

    text: str  # as written: a quantity ("8Gi") or a percentage of the node's allocatable memory ("25%")
    size_bytes: int | None = None
    node_memory_fraction: float | None = None  # (0, 1)


@dataclass(frozen=True)
class EngineSpec:
    image: str | None = None  # None: the operator's image for the pod's kind (EngineImages)
    block_size: int = _engine("block_size")
    gpu_memory_utilization: float = _engine("gpu_memory_utilization")
    max_model_len: int | None = _engine("max_model_len")  # None: the model's max_position_embeddings
    max_num_seqs: int = _engine("max_num_seqs")
    max_num_batched_tokens: int = _engine("max_num_batched_tokens")
    enable_prefix_caching: bool = _engine("enable_prefix_caching")
    enable_chunked_prefill: bool = _engine("enable_chunked_prefill")
    swap_space_gib: float = _engine("swap_space")
    tensor_parallel_size: int = _engine("tensor_parallel_size")
    num_gpu_blocks_override: int | None = _engine("num_gpu_blocks_override")  # None: the operator sizes the pool
    max_cudagraph_capture_size: int = _engine("max_cudagraph_capture_size")  # 0: no decode graphs
    kv_offload: KVOffloadSpec | None = None  # the prefix cache's host tier (--kv-offloading-size); None: off
    extra_args: tuple[str, ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    api_key_secret_ref: SecretKeyRef | None = None


@dataclass(frozen=True)
class ResourcesSpec:
    gpus: int = 1  # per pod; 0 is a CPU-only engine
    gpu_product: str | None = None
    gpu_memory_bytes: int | None = None  # None: discovered from node labels
    cpu: str | None = None
    memory: str | None = None  # a Kubernetes quantity: the pod's memory request and limit
    memory_bytes: int | None = None  # `memory` in bytes (rounded up, as Kubernetes does)


@dataclass(frozen=True)
class InferenceServiceSpec:
    name: str
    model: ModelSpec
    engine: EngineSpec = EngineSpec()
    resources: ResourcesSpec = ResourcesSpec()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    replicas: int = 1
    min_replicas: int = 0
    max_replicas: int | None = None  # None: no upper bound
    autoscaling: AutoscalingSpec | None = None  # parsed spec.autoscaling (disabled when absent)
    router: RouterSpec = RouterSpec()  # parsed spec.router (routing.spec), its default resolved

    @property
    def served_model_name(self) -> str:
        return self.name

    @property
    def effective_replicas(self) -> int:
        """spec.replicas clamped into [minReplicas, maxReplicas]: what the Deployment runs."""
        upper = self.max_replicas if self.max_replicas is not None else self.replicas
        return max(self.min_replicas, min(self.replicas, upper))
