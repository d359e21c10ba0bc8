"""Triton rotary embedding fused with the paged KV write, on the qkv GEMM's output rows.

`rotary_write_kv(qkv, positions, cos_sin, key_cache, value_cache, slot_mapping,
num_query_heads, num_kv_heads, head_dim, qk_norm=None)` does, per token, in one program:

- optionally (Qwen3) each query and key head's RMSNorm over `head_dim`
  (`qk_norm = (q weight, k weight, eps)`), before the rotation as the model does;
- RoPE, rotate-half form (transformers' `apply_rotary_pos_emb`: the first and
  second halves of a head are the pair rotated), with `cos_sin[position]` =
  `[cos | sin]` of the `head_dim / 2` frequencies (float32, from the model's own
  rotary module: `engine/cpu/fused_layers.rotary_cos_sin`); the rotated query and
  key heads are written back into `qkv` in place;
- the rotated key and the value heads written into the paged caches at the
  token's slot (`block * block_size + offset`); a slot of -1 (a padding row)
  writes nothing to the caches.

`qkv` is `[tokens, (num_query_heads + 2 * num_kv_heads) * head_dim]`, q then k then v
(the fused projection's column order), unit stride along columns. Math in float32,
rounded once to the storage dtype. The torch reference is `rotary_write_kv_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedinfer.kernels.paged_attention import CACHE_DTYPES


@triton.jit
def _rotate_heads(
    base_ptr,
    heads,
    half,
    mask,
    cos,
    sin,
    norm_ptr,
    eps,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """Load heads `[H, HALF]` x 2 halves at `base_ptr`, norm (optionally) and rotate; returns both halves (fp32)."""
    offs = heads * HEAD_DIM + half
    x1 = tl.load(base_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x1 * x1 + x2 * x2, 1) / HEAD_DIM + eps)
        w1 = tl.load(norm_ptr + half, mask=half < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(norm_ptr + HALF + half, mask=half < HALF, other=0.0).to(tl.float32)
        x1 = x1 * rstd[:, None] * w1
        x2 = x2 * rstd[:, None] * w2
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def rotary_write_kv_kernel(
    qkv_ptr,  # [tokens, (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM], rotated in place
    positions_ptr,  # int64 [tokens]
    cos_sin_ptr,  # float32 [num_positions, 2 * HALF]
    q_norm_ptr,
    k_norm_ptr,  # [HEAD_DIM] each (HAS_QK_NORM only)
    key_cache_ptr,  # [num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM]
    value_cache_ptr,  # same shape and strides
    slot_mapping_ptr,  # int64 [tokens]; -1 = padding, nothing written to the caches
    stride_t,  # qkv row stride
    stride_pos,  # cos_sin row stride
    stride_cb,
    stride_cs,
    stride_ch,  # cache strides: block, slot in block, KV head
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HAS_QK_NORM: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token)
    half = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_sin_ptr + position * stride_pos + half, mask=half < HALF, other=0.0)
    sin = tl.load(cos_sin_ptr + position * stride_pos + HALF + half, mask=half < HALF, other=0.0)
    row_ptr = qkv_ptr + token * stride_t
    dtype = qkv_ptr.dtype.element_ty

    q_heads = tl.arange(0, BLOCK_HQ)[:, None]
    q_mask = (q_heads < NUM_Q_HEADS) & (half < HALF)
    q1, q2 = _rotate_heads(row_ptr, q_heads, half, q_mask, cos, sin, q_norm_ptr, eps, HEAD_DIM, HALF, HAS_QK_NORM)
    tl.store(row_ptr + q_heads * HEAD_DIM + half, q1.to(dtype), mask=q_mask)
    tl.store(row_ptr + q_heads * HEAD_DIM + HALF + half, q2.to(dtype), mask=q_mask)

    k_ptr = row_ptr + NUM_Q_HEADS * HEAD_DIM
    k_heads = tl.arange(0, BLOCK_HK)[:, None]
    k_mask = (k_heads < NUM_KV_HEADS) & (half < HALF)
    k1, k2 = _rotate_heads(k_ptr, k_heads, half, k_mask, cos, sin, k_norm_ptr, eps, HEAD_DIM, HALF, HAS_QK_NORM)
    tl.store(k_ptr + k_heads * HEAD_DIM + half, k1.to(dtype), mask=k_mask)
    tl.store(k_ptr + k_heads * HEAD_DIM + HALF + half, k2.to(dtype), mask=k_mask)

    slot = tl.load(slot_mapping_ptr + token)
    cache_row = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
    cache_dtype = key_cache_ptr.dtype.element_ty
    k_write = k_mask & (slot >= 0)
    k_offs = cache_row + k_heads * stride_ch + half
    tl.store(key_cache_ptr + k_offs, k1.to(cache_dtype), mask=k_write)
    tl.store(key_cache_ptr + k_offs + HALF, k2.to(cache_dtype), mask=k_write)

    dims = tl.arange(0, BLOCK_D)[None, :]
    v_mask = (k_heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    v = tl.load(row_ptr + (NUM_Q_HEADS + NUM_KV_HEADS) * HEAD_DIM + k_heads * HEAD_DIM + dims, mask=v_mask)
    tl.store(value_cache_ptr + cache_row + k_heads * stride_ch + dims, v.to(cache_dtype), mask=v_mask & (slot >= 0))


def check_rotary_inputs(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_query_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> None:
    """The layout the kernel relies on; ValueError naming the argument."""
    width = (num_query_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(-1) != 1:
        raise ValueError(
            f"qkv must be [tokens, {width}] (q, k, v heads) with a unit stride along columns, got {tuple(qkv.shape)}"
        )
    tokens = qkv.shape[0]
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    if positions.dtype != torch.int64 or positions.shape != (tokens,):
        raise ValueError(f"positions must be int64 [tokens = {tokens}], got {positions.dtype} {tuple(positions.shape)}")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (tokens,):
        raise ValueError(
            f"slot_mapping must be int64 [tokens = {tokens}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if cos_sin.dtype != torch.float32 or cos_sin.dim() != 2 or cos_sin.shape[1] != head_dim or cos_sin.stride(-1) != 1:
        raise ValueError(
            f"cos_sin must be float32 [num_positions, head_dim = {head_dim}], "
            f"got {cos_sin.dtype} {tuple(cos_sin.shape)}"
        )
    if (
        key_cache.dim() != 4
        or key_cache.shape != value_cache.shape
        or key_cache.stride() != value_cache.stride()
        or tuple(key_cache.shape[2:]) != (num_kv_heads, head_dim)
        or key_cache.stride(-1) != 1
    ):
        raise ValueError(
            f"key_cache and value_cache must be [num_blocks, block_size, {num_kv_heads}, {head_dim}] "
            f"with equal strides, got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    if key_cache.dtype not in CACHE_DTYPES or value_cache.dtype != key_cache.dtype:
        raise ValueError(f"cache dtype must be one of {CACHE_DTYPES}, got {key_cache.dtype}/{value_cache.dtype}")
    devices = {t.device for t in (qkv, positions, cos_sin, key_cache, value_cache, slot_mapping)}
    if len(devices) != 1:
        raise ValueError(
            f"qkv, positions, cos_sin, caches and slot_mapping must share one device, got {sorted(map(str, devices))}"
        )


def rotary_write_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_query_heads: int,
    num_kv_heads: int,
    head_dim: int,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> None:
    """Rotate q and k of `qkv` in place and write k and v to the caches (see the module docstring)."""
    check_rotary_inputs(
        qkv, positions, cos_sin, key_cache, value_cache, slot_mapping, num_query_heads, num_kv_heads, head_dim
    )
    if qkv.shape[0] == 0:
        return
    q_norm, k_norm, eps = qk_norm if qk_norm is not None else (qkv, qkv, 0.0)
    half = head_dim // 2
    rotary_write_kv_kernel[(qkv.shape[0],)](
        qkv,
        positions,
        cos_sin,
        q_norm,
        k_norm,
        key_cache,
        value_cache,
        slot_mapping,
        qkv.stride(0),
        cos_sin.stride(0),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        eps,
        NUM_Q_HEADS=num_query_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HALF=half,
        BLOCK_HQ=triton.next_power_of_2(num_query_heads),
        BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=key_cache.shape[1],
        HAS_QK_NORM=qk_norm is not None,
    )


def rotary_write_kv_reference(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_query_heads: int,
    num_kv_heads: int,
    head_dim: int,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
) -> None:
    """`rotary_write_kv` as plain torch: transformers' q/k norm and `apply_rotary_pos_emb`, then `reference.write_kv`."""
    from pagedinfer.kernels import reference

    tokens = qkv.shape[0]
    q, k, v = qkv.split([num_query_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q, k = q.float().view(tokens, -1, head_dim), k.float().view(tokens, -1, head_dim)
    if qk_norm is not None:
        q_weight, k_weight, eps = qk_norm
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * q_weight.float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * k_weight.float()
    half = head_dim // 2
    cos, sin = cos_sin[positions, :half][:, None], cos_sin[positions, half:][:, None]
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    q, k = rotate(q).to(qkv.dtype), rotate(k).to(qkv.dtype)
    qkv[:, : num_query_heads * head_dim] = q.flatten(1)
    qkv[:, num_query_heads * head_dim : (num_query_heads + num_kv_heads) * head_dim] = k.flatten(1)
    reference.write_kv(k, v.view(tokens, -1, head_dim), key_cache, value_cache, slot_mapping)
