"""From a validated spec and a GPU memory size to the KV-cache plan in `status.kvCache`.

The arithmetic is `pagedinfer.contracts.sizing.plan_kv_cache`, the same function
`pagedinfer plan` and the engine call, so the three agree for the same inputs.
This module only chooses the inputs:

- `spec.engine.numGpuBlocksOverride` skips sizing (source `override`);
- `spec.resources.gpus: 0` is a CPU engine (see `cpu_plan`): its "device
  memory" is `--cpu-memory-budget`, which the operator derives from the pod's
  memory limit (source `memory`), or the engine sizes within that budget by
  itself when the operator cannot read the model's shape (source `engine`);
- otherwise the GPU memory is `spec.resources.gpuMemory` (source `spec`) or
  the smallest `nvidia.com/gpu.memory` among matching nodes (source
  `node-labels`), and the model facts come from `spec.model.architecture`,
  a ConfigMap's or the Hub's config.json (see `model_shape`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pagedinfer.contracts import sizing
from pagedinfer.contracts.model_shape import ModelShape, resolve_dtype
from pagedinfer.contracts.sizing_inputs import sizing_inputs
from pagedinfer.operator.kv_plan.node_memory import GPU_PRODUCT_LABEL, Placement
from pagedinfer.operator.spec.crd_model import Architecture, InferenceServiceSpec

SOURCE_OVERRIDE = "override"
SOURCE_SPEC = "spec"
SOURCE_NODE_LABELS = "node-labels"
SOURCE_ENGINE = "engine"
SOURCE_MEMORY = "memory"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# What a CPU engine's process holds besides its --cpu-memory-budget (which holds the
# weights, the activation reserve and the KV cache, as GPU memory does on a GPU): the
# Python runtime, torch and transformers, the tokenizer and the HTTP server. Measured
# with the operator's own command line for the embedded model (CPU torch 2.13): 0.45 GiB
# RSS once ready, and 0.48 GiB besides a KV cache written through under load (peak RSS
# 705 MiB with a 256 MiB budget; 1.37 GiB with the 1 GiB budget of a 2Gi pod, every KV
# block written). The engine image's CUDA torch maps more libraries, so 1 GiB leaves
# about half of it as margin.
CPU_RUNTIME_OVERHEAD_BYTES = 1 << 30
# The memory request and limit of a CPU engine's pod when spec.resources.memory is
# unset: 2 GiB of budget, what `pagedinfer serve --cpu-memory-budget` defaults to.
DEFAULT_CPU_MEMORY = "3Gi"
DEFAULT_CPU_MEMORY_BYTES = 3 << 30


@dataclass(frozen=True)
class KVCachePlan:
    """What `status.kvCache` reports. Sizes are per GPU (per CPU engine) in bytes; None when not known before start.

    A CPU engine's plan has cpu_memory_budget_bytes (the engine's
    --cpu-memory-budget) and no gpu_memory_bytes; a GPU engine's the reverse.
    """

    source: str
    block_size: int
    num_gpu_blocks: int | None
    gpu_memory_bytes: int | None = None
    weight_bytes_per_gpu: int | None = None
    bytes_per_token: int | None = None
    bytes_per_block: int | None = None
    cpu_memory_budget_bytes: int | None = None
    tensor_parallel_size: int | None = None  # GPU plans: ranks per replica; sizes above are per rank's GPU
    cuda_graph_bytes: int | None = None  # the decode graphs' estimate the pool left room for; None without graphs
    offload_bytes: int | None = None  # the prefix cache's host tier per rank (spec.engine.kvOffload); None: off

    @classmethod
    def from_result(cls, source: str, result: sizing.SizingResult, **memory_bytes: int) -> KVCachePlan:
        """A sized plan; `memory_bytes` is gpu_memory_bytes or cpu_memory_budget_bytes, whichever was sized."""
        return cls(
            source=source,
            block_size=result.block_size,
            num_gpu_blocks=result.num_gpu_blocks,
            weight_bytes_per_gpu=result.weight_bytes_per_gpu,
            bytes_per_token=result.bytes_per_token,
            bytes_per_block=result.bytes_per_block,
            cuda_graph_bytes=result.cuda_graph_bytes or None,
            **memory_bytes,
        )

    @property
    def max_tokens(self) -> int | None:
        return None if self.num_gpu_blocks is None else self.num_gpu_blocks * self.block_size

    @property
    def offload_tokens(self) -> int | None:
        """Tokens the host tier holds (whole blocks, as the engine counts them); None when off or not known."""
        if not self.offload_bytes or not self.bytes_per_block:
            return None
        return self.offload_bytes // self.bytes_per_block * self.block_size

    def to_status(self) -> dict[str, Any]:
        fields = {
            "source": self.source,
            "tensorParallelSize": self.tensor_parallel_size,
            "blockSize": self.block_size,
            "numGpuBlocks": self.num_gpu_blocks,
            "maxTokens": self.max_tokens,
            "gpuMemoryBytes": self.gpu_memory_bytes,
            "weightBytesPerGpu": self.weight_bytes_per_gpu,
            "bytesPerToken": self.bytes_per_token,
            "bytesPerBlock": self.bytes_per_block,
            "cudaGraphBytes": self.cuda_graph_bytes,
            "cpuMemoryBudgetBytes": self.cpu_memory_budget_bytes,
            "offloadBytes": self.offload_bytes,
            "offloadTokens": self.offload_tokens,
        }
        return {key: value for key, value in fields.items() if value is not None}


def placement_for(spec: InferenceServiceSpec) -> Placement:
    """The pod's scheduling constraints; the Deployment builder writes exactly these.

    GPU pods tolerate the `nvidia.com/gpu` NoSchedule taint that GKE and many
    clusters put on GPU nodes.
    """
    selector = dict(spec.node_selector)
    if spec.resources.gpu_product:
        selector[GPU_PRODUCT_LABEL] = spec.resources.gpu_product
    tolerations = tuple(spec.tolerations)
    if spec.resources.gpus and GPU_TOLERATION not in tolerations:
        tolerations = tolerations + (GPU_TOLERATION,)
    return Placement(gpus=spec.resources.gpus, node_selector=selector, tolerations=tolerations, affinity=spec.affinity)


def engine_device(cpu: bool) -> str:
    """The device type of the engine pod: "cpu" for spec.resources.gpus 0, else "cuda"."""
    return "cpu" if cpu else "cuda"


def shape_from_architecture(arch: Architecture, dtype: str, cpu: bool = False) -> ModelShape:
    """spec.model.architecture as a ModelShape; dtype auto is what the engine picks for a config naming none."""
    return ModelShape(
        num_layers=arch.num_layers,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        num_parameters=arch.num_parameters,
        dtype=resolve_dtype(dtype, {}, engine_device(cpu)),
        hidden_size=arch.hidden_size,
        max_position_embeddings=arch.max_position_embeddings,
    )


def shape_from_config(config: Any, dtype: str, cpu: bool = False) -> ModelShape:
    """A parsed config.json to a ModelShape, its dtype as the engine resolves it on the pod's device.

    Raises model_shape.InvalidModelConfigError naming the bad field and its value.
    """
    return ModelShape.from_hf_config(config, dtype=dtype, device=engine_device(cpu))


def needs_model_shape(spec: InferenceServiceSpec) -> bool:
    return spec.engine.num_gpu_blocks_override is None


def cpu_memory(spec: InferenceServiceSpec) -> tuple[str, int]:
    """A CPU engine pod's memory request and limit: (quantity, bytes) of spec.resources.memory or the default."""
    r = spec.resources
    if r.memory is not None and r.memory_bytes is not None:
        return r.memory, r.memory_bytes
    return DEFAULT_CPU_MEMORY, DEFAULT_CPU_MEMORY_BYTES


def pod_memory_bytes(spec: InferenceServiceSpec) -> int:
    """The engine pod's memory request before its host tier: a CPU engine's `cpu_memory`, else spec.resources.memory."""
    if spec.resources.gpus == 0:
        return cpu_memory(spec)[1]
    return spec.resources.memory_bytes or 0


def plan_for(
    spec: InferenceServiceSpec, shape: ModelShape | None, gpu_memory_bytes: int | None, source: str
) -> KVCachePlan:
    """The plan for one engine; raises sizing.InsufficientMemoryError when nothing fits."""
    engine = spec.engine
    if spec.resources.gpus == 0:
        return cpu_plan(spec, shape)
    if engine.num_gpu_blocks_override is not None:
        plan = override_plan(spec, shape)
    elif shape is None or gpu_memory_bytes is None:
        raise ValueError("plan_for: a GPU engine needs the model shape and the GPU memory")
    else:
        result = sizing.plan_kv_cache(sizing_inputs(engine, shape, gpu_memory_bytes, "cuda"))
        plan = KVCachePlan.from_result(source, result, gpu_memory_bytes=result.gpu_memory_bytes)
    # numGpuBlocks is per replica: every rank holds that many blocks of its 1/N of the KV heads
    return dataclasses.replace(plan, tensor_parallel_size=engine.tensor_parallel_size)


def cpu_plan(spec: InferenceServiceSpec, shape: ModelShape | None) -> KVCachePlan:
    """The plan of a CPU engine (gpus: 0), whose pod gets the memory `cpu_memory` names as request and limit.

    The engine's --cpu-memory-budget is that memory less CPU_RUNTIME_OVERHEAD_BYTES,
    and the engine sizes within it as on a GPU: budget x gpuMemoryUtilization
    - weights - activation reserve (on a CPU, the per-token term of
    `estimate_activation_reserve_bytes` alone, as the engine estimates it),
    so the process stays under the limit whatever the load. With the model's
    shape this is planned here and the engine gets the block count too
    (source `memory`); without it the engine sizes itself within the budget
    (source `engine`). Raises sizing.InsufficientMemoryError, naming the
    memory to set, when not one maxModelLen sequence fits.
    """
    engine = spec.engine
    memory, memory_bytes = cpu_memory(spec)
    budget = memory_bytes - CPU_RUNTIME_OVERHEAD_BYTES
    if budget < 1:
        raise sizing.InsufficientMemoryError(
            f"spec.resources.memory {memory} leaves no memory for the CPU engine's weights and KV cache: its"
            f" runtime alone takes {_gib(CPU_RUNTIME_OVERHEAD_BYTES)}. Set spec.resources.memory to"
            f" {CPU_RUNTIME_OVERHEAD_BYTES // 2**20}Mi plus the weights and KV cache (unset, it is"
            f" {DEFAULT_CPU_MEMORY})."
        )
    if engine.num_gpu_blocks_override is not None:
        return dataclasses.replace(override_plan(spec, shape), cpu_memory_budget_bytes=budget)
    if shape is None:
        return KVCachePlan(
            source=SOURCE_ENGINE, block_size=engine.block_size, num_gpu_blocks=None, cpu_memory_budget_bytes=budget
        )
    inputs = sizing_inputs(engine, shape, budget, "cpu")
    try:
        result = sizing.plan_kv_cache(inputs)
    except sizing.InsufficientMemoryError:
        raise sizing.InsufficientMemoryError(cpu_shortfall_message(inputs, memory)) from None
    return KVCachePlan.from_result(SOURCE_MEMORY, result, cpu_memory_budget_bytes=budget)


def override_plan(spec: InferenceServiceSpec, shape: ModelShape | None) -> KVCachePlan:
    """spec.engine.numGpuBlocksOverride as the plan, with the bytes per block when the shape is known."""
    engine = spec.engine
    per_block = None
    if shape is not None:
        per_block = sizing.kv_bytes_per_block(shape, engine.block_size, engine.tensor_parallel_size)
    return KVCachePlan(
        source=SOURCE_OVERRIDE,
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_gpu_blocks_override,
        bytes_per_block=per_block,
        bytes_per_token=None if per_block is None else per_block // engine.block_size,
    )


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


def cpu_shortfall_message(inputs: sizing.SizingInputs, memory: str) -> str:
    """Why a CPU engine does not fit in `memory`, and the smallest spec.resources.memory that holds one sequence."""
    shape = inputs.shape
    per_block = sizing.kv_bytes_per_block(shape, inputs.block_size, inputs.tensor_parallel_size)
    weights = sizing.weight_bytes_per_gpu(shape, inputs.tensor_parallel_size)
    reserve = inputs.activation_reserve_bytes or 0
    max_model_len = inputs.max_model_len or shape.max_position_embeddings or inputs.block_size
    needed = -(-max_model_len // inputs.block_size)
    usable = int(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization) - weights - reserve
    fits = max(usable, 0) // per_block
    least_budget = math.ceil((needed * per_block + weights + reserve) / inputs.gpu_memory_utilization)
    least_mib = -(-(least_budget + CPU_RUNTIME_OVERHEAD_BYTES) // 2**20) + 1
    return (
        f"The CPU engine does not fit in spec.resources.memory {memory}: less its runtime"
        f" ({_gib(CPU_RUNTIME_OVERHEAD_BYTES)}) that leaves a budget of {_gib(inputs.gpu_memory_bytes)},"
        f" x gpuMemoryUtilization {inputs.gpu_memory_utilization} less weights {_gib(weights)} and"
        f" activation reserve {_gib(reserve)} (maxNumBatchedTokens={inputs.max_num_batched_tokens}) holds"
        f" {fits} KV blocks of {per_block} bytes, but one maxModelLen={max_model_len} sequence needs"
        f" {needed}. Set spec.resources.memory to at least {least_mib}Mi, or lower spec.engine.maxModelLen."
    )
