"""Torch references of the native layer ops (`layer_ops.py`): what each computes, in plain torch.

Each takes the native op's arguments and returns what it writes, computed in
float32 from the inputs and rounded once to their dtype (the native ops'
contract; transformers' modules round after each op in a 16-bit dtype, and
equal these in float32 up to rounding). Tests compare the native ops with
these; nothing in the engine calls them.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised, new residual): what the op leaves in `x` and in `residual` (the norm of the float32 sum)."""
    summed = residual.float() + x.float()
    return rms_norm(summed, weight, eps).to(x.dtype), summed.to(x.dtype)


def _rotate_heads(
    heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norm: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """heads [tokens, n, head_dim] (float32) normalised (optional) and rotated as transformers' rotate_half RoPE."""
    if norm is not None:
        heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + eps) * norm.float()
    half = heads.shape[-1] // 2
    rotated = torch.cat((-heads[..., half:], heads[..., :half]), dim=-1)
    return heads * cos + rotated * sin


def rotary_embedding(
    positions: torch.Tensor,
    qkv: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_query_heads: int,
    num_key_heads: int,
    head_dim: int,
    query_norm: torch.Tensor | None = None,
    key_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The new qkv: query and key heads normalised and rotated, value columns as they were."""
    half = head_dim // 2
    rows = cos_sin_cache[positions]
    cos = torch.cat((rows[:, :half], rows[:, :half]), dim=-1)[:, None, :]
    sin = torch.cat((rows[:, half:], rows[:, half:]), dim=-1)[:, None, :]
    tokens = qkv.shape[0]
    q_end, k_end = num_query_heads * head_dim, (num_query_heads + num_key_heads) * head_dim
    query = qkv[:, :q_end].float().reshape(tokens, num_query_heads, head_dim)
    key = qkv[:, q_end:k_end].float().reshape(tokens, num_key_heads, head_dim)
    out = qkv.clone()
    out[:, :q_end] = _rotate_heads(query, cos, sin, query_norm, eps).reshape(tokens, -1).to(qkv.dtype)
    out[:, q_end:k_end] = _rotate_heads(key, cos, sin, key_norm, eps).reshape(tokens, -1).to(qkv.dtype)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
