"""The entry points the engine calls: each op picks the CPU path, torch, or the Triton kernel.

Choice, made on every call (so a test may change it between calls; `kernels_for`
makes it once for a whole model step, every layer's calls then going straight to
the chosen kernels):

- `PAGEDINFER_ATTENTION=native` (CPU tensors only): the CPU path
  (`cpu/ops.py`): the native kernels, built on first use, falling back with
  one warning to the vectorised torch path if they cannot be built;
- `PAGEDINFER_ATTENTION=torch` forces the vectorised torch path
  (`cpu/torch_attention.py`; write/copy/swap from `reference.py`), any device;
- `PAGEDINFER_ATTENTION=triton` forces the Triton kernels; on CPU tensors this
  needs `TRITON_INTERPRET=1` set before triton is first imported;
- unset, empty or `auto`: Triton for CUDA tensors, native otherwise.

Block copies and swaps have no native kernel: the CPU path runs their torch
versions. The Triton and CPU modules are imported on first use, so a CPU-only
process never imports triton and a CUDA process never builds the CPU kernels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedinfer.kernels import reference
from pagedinfer.kernels.metadata import AttentionMetadata

ENV_VAR = "PAGEDINFER_ATTENTION"
BACKENDS = ("native", "torch", "triton")


def backend_for(device: torch.device) -> str:
    """The backend used for tensors on `device`, as `PAGEDINFER_ATTENTION` says now."""
    choice = os.environ.get(ENV_VAR, "").strip().lower()
    if choice in ("", "auto"):
        return "triton" if device.type == "cuda" else "native"
    if choice not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={choice!r}: expected one of native, torch, triton, auto")
    if choice == "native" and device.type != "cpu":
        raise ValueError(f"{ENV_VAR}=native runs on CPU tensors only, got {device.type} tensors")
    if choice == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{ENV_VAR}=triton on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported")
    return choice


@dataclass(frozen=True, slots=True)
class Kernels:
    """One backend's `write_kv` and `paged_attention` (the signatures of this module's)."""

    backend: str
    write_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]


def kernels_for(device: torch.device) -> Kernels:
    """The kernels `write_kv` and `paged_attention` would call now for tensors on `device`."""
    backend = backend_for(device)
    if backend == "native":
        from pagedinfer.kernels.cpu import ops

        return Kernels(backend, ops.write_kv, ops.paged_attention)
    if backend == "torch":
        from pagedinfer.kernels.cpu import torch_attention

        return Kernels(backend, reference.write_kv, torch_attention.paged_attention)
    from pagedinfer.kernels.paged_attention import paged_attention_triton
    from pagedinfer.kernels.write_kv import write_kv_triton

    return Kernels(backend, write_kv_triton, paged_attention_triton)


def check_sliding_window(sliding_window: int | None) -> None:
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive or None, got {sliding_window}")


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's K/V `[num_tokens, num_kv_heads, head_dim]` into the paged caches; slot -1 is skipped."""
    kernels_for(key_cache.device).write_kv(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attention of the packed queries `[num_tokens, num_heads, head_dim]` over the paged K/V.

    The decodes (first `num_decode_seqs` sequences) and the prefill chunks (the
    rest) go to their own Triton kernels; the CPU paths handle both in one call.
    """
    check_sliding_window(sliding_window)
    return kernels_for(query.device).paged_attention(query, key_cache, value_cache, metadata, scale, sliding_window)


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy-on-write: block `src` -> block `dst` for each `(src, dst)` row, in every layer."""
    if backend_for(key_caches[0].device) != "triton":
        reference.copy_blocks(key_caches, value_caches, block_mapping)
        return
    from pagedinfer.kernels.block_copy import copy_blocks_triton

    copy_blocks_triton(key_caches, value_caches, block_mapping)


def swap_blocks(
    src_cache: torch.Tensor, dst_cache: torch.Tensor, block_mapping: torch.Tensor, block_dim: int = 0
) -> None:
    """Move blocks between a device cache and a pinned host cache, `(src, dst)` rows."""
    device = src_cache.device if src_cache.device.type != "cpu" else dst_cache.device
    if backend_for(device) != "triton":
        reference.swap_blocks(src_cache, dst_cache, block_mapping, block_dim)
        return
    from pagedinfer.kernels.block_copy import swap_blocks_triton

    swap_blocks_triton(src_cache, dst_cache, block_mapping, block_dim)
