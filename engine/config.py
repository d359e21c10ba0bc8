"""Engine configuration: one frozen dataclass, validated when built."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from pagedinfer.engine.host_memory import available_host_memory
from pagedinfer.engine.sizing import ENGINE_DTYPES, VALID_BLOCK_SIZES

PREEMPTION_MODES = ("recompute", "swap")
DTYPES = ("auto", *ENGINE_DTYPES)
DEVICES = ("auto", "cpu", "cuda")


def _positive(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")


def _check_swap_space_fits(swap_space_gib: float, num_ranks: int) -> None:
    """The host swap pools (swap mode only; one per tensor-parallel rank) must fit in the host memory available."""
    bound = available_host_memory()
    if bound is not None and swap_space_gib * num_ranks * 2**30 > bound.available_bytes:
        per_rank = f" x {num_ranks} tensor-parallel ranks" if num_ranks > 1 else ""
        raise ValueError(
            f"swap_space (--swap-space): {swap_space_gib:g} GiB{per_rank} of host memory for swapped-out KV blocks"
            " does not"
            f" fit in the {bound.available_bytes / 2**30:.2f} GiB this host has available ({bound.source});"
            " lower it, or use preemption_mode recompute, which needs no host pool")


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes one engine. Field names follow vLLM's flags.

    max_model_len None means the model's max_position_embeddings.
    num_gpu_blocks_override None means: size the pool by profiling.
    On CPU the "device memory" is cpu_memory_budget_bytes.
    """

    model: str
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    swap_space: float = 4.0  # GiB of host memory for swapped-out KV blocks (swap mode; must fit what is available)
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    preemption_mode: str = "recompute"
    tensor_parallel_size: int = 1  # ranks (GPUs) of one replica; >1: engine/distributed
    cpu_memory_budget_bytes: int = 2 << 30
    watermark: float = 0.01  # fraction of blocks kept free when admitting new requests
    tokenizer: str | None = None
    served_model_name: str | None = None
    revision: str | None = None  # of a Hub model id; None: main
    compile: bool = False  # CPU, tensor_parallel_size 1: torch.compile the forward per token bucket (engine/cpu)

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not str(self.model):
            raise ValueError(f"model: must be a model directory path, got {self.model!r}")
        if isinstance(self.block_size, bool) or self.block_size not in VALID_BLOCK_SIZES:
            raise ValueError(f"block_size: must be one of {VALID_BLOCK_SIZES}, got {self.block_size!r}")
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {u!r}")
        _positive("num_gpu_blocks_override", self.num_gpu_blocks_override, allow_none=True)
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("max_model_len", self.max_model_len, allow_none=True)
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        if isinstance(self.swap_space, bool) or not isinstance(self.swap_space, (int, float)) \
                or not math.isfinite(self.swap_space) or self.swap_space < 0:
            raise ValueError(f"swap_space (--swap-space): must be a number of GiB >= 0, got {self.swap_space!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device: must be one of {DEVICES}, got {self.device!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode: must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.preemption_mode == "swap":
            _check_swap_space_fits(self.swap_space, self.tensor_parallel_size)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching: must be a boolean, got {self.enable_prefix_caching!r}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(f"enable_chunked_prefill: must be a boolean, got {self.enable_chunked_prefill!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile: must be a boolean, got {self.compile!r}")
        if self.compile and (self.device == "cuda" or self.tensor_parallel_size > 1):
            raise ValueError("compile (--compile): the compiled forward runs on a CPU with tensor_parallel_size 1"
                             f" only, got device {self.device!r}, tensor_parallel_size {self.tensor_parallel_size}")
        _positive("cpu_memory_budget_bytes", self.cpu_memory_budget_bytes)
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark: must be in [0, 1), got {self.watermark!r}")
        if not self.enable_chunked_prefill and self.max_model_len is not None \
                and self.max_model_len > self.max_num_batched_tokens:
            raise ValueError(
                f"max_num_batched_tokens: without chunked prefill it must be >= max_model_len"
                f" ({self.max_model_len}), got {self.max_num_batched_tokens}")
