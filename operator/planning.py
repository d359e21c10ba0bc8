"""From a validated spec and a GPU memory size to the KV-cache plan in `status.kvCache`.

The arithmetic is `pagedinfer.engine.sizing.plan_kv_cache`, the same function
`pagedinfer plan` and the engine call, so the three agree for the same inputs.
This module only chooses the inputs:

- `spec.engine.numGpuBlocksOverride` skips sizing (source `override`);
- `spec.resources.gpus: 0` is a CPU engine that sizes itself (no plan);
- otherwise the GPU memory is `spec.resources.gpuMemory` (source `spec`) or
  the smallest `nvidia.com/gpu.memory` among matching nodes (source
  `node-labels`), and the model facts come from `spec.model.architecture`,
  a ConfigMap's or the Hub's config.json (see `model_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pagedinfer.engine import sizing
from pagedinfer.operator.crd_model import Architecture, InferenceServiceSpec
from pagedinfer.operator.node_memory import Placement

SOURCE_OVERRIDE = "override"
SOURCE_SPEC = "spec"
SOURCE_NODE_LABELS = "node-labels"
SOURCE_ENGINE = "engine"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class KVCachePlan:
    """What `status.kvCache` reports. Sizes are per GPU in bytes; None when not known before start."""

    source: str
    block_size: int
    num_gpu_blocks: int | None
    gpu_memory_bytes: int | None = None
    weight_bytes_per_gpu: int | None = None
    bytes_per_token: int | None = None
    bytes_per_block: int | None = None

    @property
    def max_tokens(self) -> int | None:
        return None if self.num_gpu_blocks is None else self.num_gpu_blocks * self.block_size

    def to_status(self) -> dict[str, Any]:
        fields = {
            "source": self.source,
            "blockSize": self.block_size,
            "numGpuBlocks": self.num_gpu_blocks,
            "maxTokens": self.max_tokens,
            "gpuMemoryBytes": self.gpu_memory_bytes,
            "weightBytesPerGpu": self.weight_bytes_per_gpu,
            "bytesPerToken": self.bytes_per_token,
            "bytesPerBlock": self.bytes_per_block,
        }
        return {key: value for key, value in fields.items() if value is not None}


def placement_for(spec: InferenceServiceSpec) -> Placement:
    """The pod's scheduling constraints; the Deployment builder writes exactly these.

    GPU pods tolerate the `nvidia.com/gpu` NoSchedule taint that GKE and many
    clusters put on GPU nodes.
    """
    selector = dict(spec.node_selector)
    if spec.resources.gpu_product:
        selector["nvidia.com/gpu.product"] = spec.resources.gpu_product
    tolerations = tuple(spec.tolerations)
    if spec.resources.gpus and GPU_TOLERATION not in tolerations:
        tolerations = tolerations + (GPU_TOLERATION,)
    return Placement(gpus=spec.resources.gpus, node_selector=selector, tolerations=tolerations,
                     affinity=spec.affinity)


def shape_from_architecture(arch: Architecture, dtype: str) -> sizing.ModelShape:
    return sizing.ModelShape(
        num_layers=arch.num_layers,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        num_parameters=arch.num_parameters,
        dtype="bfloat16" if dtype == "auto" else dtype,
        hidden_size=arch.hidden_size,
        max_position_embeddings=arch.max_position_embeddings,
    )


def shape_from_config(config: Mapping[str, Any], dtype: str) -> sizing.ModelShape:
    """A config.json (dict) to a ModelShape; ValueError names what is missing."""
    return sizing.ModelShape.from_hf_config(config, dtype=dtype)


def needs_node_discovery(spec: InferenceServiceSpec) -> bool:
    return (spec.resources.gpus > 0 and spec.engine.num_gpu_blocks_override is None
            and spec.resources.gpu_memory_bytes is None)


def needs_model_shape(spec: InferenceServiceSpec) -> bool:
    return spec.resources.gpus > 0 and spec.engine.num_gpu_blocks_override is None


def plan_for(spec: InferenceServiceSpec, shape: sizing.ModelShape | None,
             gpu_memory_bytes: int | None, source: str) -> KVCachePlan:
    """The plan for one engine; raises sizing.InsufficientMemoryError when nothing fits."""
    engine = spec.engine
    if engine.num_gpu_blocks_override is not None:
        per_block = None
        if shape is not None:
            per_block = sizing.kv_bytes_per_block(shape, engine.block_size, engine.tensor_parallel_size)
        return KVCachePlan(source=SOURCE_OVERRIDE, block_size=engine.block_size,
                           num_gpu_blocks=engine.num_gpu_blocks_override, bytes_per_block=per_block,
                           bytes_per_token=None if per_block is None else per_block // engine.block_size)
    if spec.resources.gpus == 0:
        return KVCachePlan(source=SOURCE_ENGINE, block_size=engine.block_size, num_gpu_blocks=None)
    if shape is None or gpu_memory_bytes is None:
        raise ValueError("plan_for: a GPU engine needs the model shape and the GPU memory")
    result = sizing.plan_kv_cache(sizing_inputs(spec, shape, gpu_memory_bytes))
    return KVCachePlan(
        source=source,
        block_size=result.block_size,
        num_gpu_blocks=result.num_gpu_blocks,
        gpu_memory_bytes=result.gpu_memory_bytes,
        weight_bytes_per_gpu=result.weight_bytes_per_gpu,
        bytes_per_token=result.bytes_per_token,
        bytes_per_block=result.bytes_per_block,
    )


def sizing_inputs(spec: InferenceServiceSpec, shape: sizing.ModelShape, gpu_memory_bytes: int) -> sizing.SizingInputs:
    """The exact SizingInputs `pagedinfer plan` builds from the same flags."""
    engine = spec.engine
    return sizing.SizingInputs(
        shape=shape,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        block_size=engine.block_size,
        tensor_parallel_size=engine.tensor_parallel_size,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len,
    )
