"""The SizingInputs of an engine's options, built once for `pagedinfer plan` and the operator.

`sizing_inputs` reads the sizing options by their `EngineConfig` field names from whatever carries them:
`plan`'s parsed flags (`engine/cli_plan.py`) or the operator's `spec.engine` (`operator/kv_plan/planning.py`),
so both hand `sizing.plan_kv_cache` the same inputs for the same options (tests/operator/test_planning.py
compares them). On a CPU the activation reserve is the one the engine estimates there.
"""

from __future__ import annotations

from typing import Protocol

from pagedinfer.contracts import sizing
from pagedinfer.contracts.model_shape import ModelShape


class SizingOptions(Protocol):
    """The engine options that decide num_gpu_blocks (named as EngineConfig's fields)."""

    gpu_memory_utilization: float
    block_size: int
    tensor_parallel_size: int
    max_num_batched_tokens: int
    max_model_len: int | None
    max_num_seqs: int
    max_cudagraph_capture_size: int


def sizing_inputs(options: SizingOptions, shape: ModelShape, memory_bytes: int, device: str) -> sizing.SizingInputs:
    """The inputs for one engine on `device` with `memory_bytes` per GPU (on a CPU: its memory budget)."""
    reserve = None
    if device == "cpu":
        reserve = sizing.estimate_activation_reserve_bytes(shape, options.max_num_batched_tokens, "cpu")
    return sizing.SizingInputs(
        shape=shape,
        gpu_memory_bytes=memory_bytes,
        activation_reserve_bytes=reserve,
        gpu_memory_utilization=options.gpu_memory_utilization,
        block_size=options.block_size,
        tensor_parallel_size=options.tensor_parallel_size,
        max_num_batched_tokens=options.max_num_batched_tokens,
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
        max_cudagraph_capture_size=options.max_cudagraph_capture_size,
    )
