"""Profiling: how many KV blocks fit, from the activation memory a step needs (measured by a forward at the
step budget on CUDA, estimated on a CPU) and the sizing arithmetic (`contracts/sizing.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pagedinfer.contracts import sizing
from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
from pagedinfer.engine.distributed.step_message import StepInputs

if TYPE_CHECKING:
    from pagedinfer.engine.runner.model_runner import ModelRunner


def size_kv_cache(runner: ModelRunner, max_model_len: int) -> sizing.SizingResult:
    """Profile (on CUDA) or estimate (on CPU) activations, then size the pool with `sizing.plan_kv_cache`."""
    shape = runner.model_shape()
    if runner.device.type == "cuda":
        total_bytes = torch.cuda.mem_get_info(runner.device)[1]
        reserve = profile_cuda_activation_bytes(runner, max_model_len)
    else:
        total_bytes = runner.config.cpu_memory_budget_bytes
        reserve = sizing.estimate_activation_reserve_bytes(shape, runner.config.max_num_batched_tokens, "cpu")
    return sizing.plan_kv_cache(
        sizing.SizingInputs(
            shape=shape,
            gpu_memory_bytes=total_bytes,
            gpu_memory_utilization=runner.config.gpu_memory_utilization,
            block_size=runner.block_size,
            max_num_batched_tokens=runner.config.max_num_batched_tokens,
            max_model_len=max_model_len,
            activation_reserve_bytes=reserve,
            weight_bytes_per_gpu=runner.weight_bytes,
            max_num_seqs=runner.config.max_num_seqs,
            max_cudagraph_capture_size=runner.config.max_cudagraph_capture_size,
        )
    )


def profile_cuda_activation_bytes(runner: ModelRunner, max_model_len: int) -> int:
    """Peak memory of a forward at max_num_batched_tokens, plus non-torch usage (CUDA context)."""
    num_tokens = min(runner.config.max_num_batched_tokens, runner.config.max_num_seqs * max_model_len)
    seq_len = min(max_model_len, num_tokens)
    lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
    num_blocks = sum(-(-n // runner.block_size) for n in lens)
    runner.allocate_kv_cache(num_blocks, 0, decode_graphs=False)
    torch.cuda.synchronize(runner.device)
    torch.cuda.reset_peak_memory_stats(runner.device)
    before = torch.cuda.memory_allocated(runner.device)
    next_block = 0
    tables = []
    for i, n in enumerate(lens):
        nb = -(-n // runner.block_size)
        tables.append(BlockTableUpdate(i, 0, tuple(range(next_block, next_block + nb))))
        next_block += nb
    # as many logits rows as a real step may keep (one per running sequence), not one per profiled sequence
    keep = list(range(num_tokens - min(runner.config.max_num_seqs, num_tokens), num_tokens))
    runner.run_step(
        StepInputs([0] * num_tokens, list(range(len(lens))), lens, lens, keep, TableDeltas(tuple(tables)))
    ).float()
    torch.cuda.synchronize(runner.device)
    peak = torch.cuda.max_memory_allocated(runner.device) - before
    runner.release_kv_cache()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(runner.device)
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved(runner.device))
    return int(peak + non_torch)
