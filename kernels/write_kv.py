"""Triton `write_kv` (a.k.a. reshape_and_cache): scatter the step's new K/V into the paged cache.

One program per token: it reads the token's slot (`block * block_size +
offset`, or -1 for padding) and copies its `[num_kv_heads, head_dim]` key and
value rows to that slot of the key and value caches, casting to the cache
dtype. A padding token's loads and stores are fully masked. The torch
reference is `reference.write_kv`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedinfer.kernels.paged_attention import CACHE_DTYPES


@triton.jit
def write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # same shape and strides as the key cache
    slot_mapping_ptr,  # int64 [num_tokens]; -1 = padding, skipped
    stride_kt,
    stride_kh,  # key strides (head_dim stride is 1)
    stride_vt,
    stride_vh,  # value strides (head_dim stride is 1)
    stride_cb,
    stride_cs,
    stride_ch,  # cache strides: block, slot in block, KV head
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,  # next power of two of NUM_KV_HEADS
    BLOCK_D: tl.constexpr,  # next power of two of HEAD_DIM
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM) & (slot >= 0)
    cache_offs = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + heads * stride_ch + dims
    key = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    tl.store(key_cache_ptr + cache_offs, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    value = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(value_cache_ptr + cache_offs, value.to(value_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Checks the layout contract, then launches one program per token."""
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(
            f"key and value must both be [num_tokens, num_kv_heads, head_dim], "
            f"got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape or key_cache.stride() != value_cache.stride():
        raise ValueError(
            "key_cache and value_cache must be [num_blocks, block_size, num_kv_heads, head_dim] "
            "with equal shapes and strides"
        )
    if tuple(key.shape[1:]) != tuple(key_cache.shape[2:]):
        raise ValueError(
            f"key rows {tuple(key.shape[1:])} do not match the cache's "
            f"[num_kv_heads, head_dim] = {tuple(key_cache.shape[2:])}"
        )
    if key_cache.dtype not in CACHE_DTYPES or value_cache.dtype != key_cache.dtype:
        raise ValueError(f"cache dtype must be one of {CACHE_DTYPES}, got {key_cache.dtype}/{value_cache.dtype}")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (key.shape[0],):
        raise ValueError(
            f"slot_mapping must be int64 [num_tokens = {key.shape[0]}], "
            f"got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if key.stride(-1) != 1 or value.stride(-1) != 1 or key_cache.stride(-1) != 1:
        raise ValueError("key, value and the caches must have a unit stride along head_dim")
    if len({key.device, value.device, key_cache.device, value_cache.device, slot_mapping.device}) != 1:
        raise ValueError("key, value, caches and slot_mapping must share one device")
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    write_kv_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=key_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
