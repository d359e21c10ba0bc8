"""Paged attention plugged into transformers through its AttentionInterface.

transformers' attention modules call `fn(module, query, key, value,
attention_mask, scaling=..., **kwargs)` with q as [1, heads, tokens, head_dim]
and k/v as [1, kv_heads, tokens, head_dim] (RoPE and q/k norms already
applied). Every extra keyword given to `model(...)` reaches `fn` unchanged:
the step's `StepContext` travels that way as `pagedinfer_step`. As long as no
mask function is registered under our name, transformers builds no mask
(attention_mask is None): masking is ours (causal, lengths, sliding window).

The function writes the step's K/V into the paged cache through the slot
mapping, then attends over the cache through the block tables, via
`pagedinfer.kernels.dispatch` (the native CPU kernels on CPU, Triton on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedinfer.kernels import dispatch
from pagedinfer.kernels.metadata import AttentionMetadata

ATTN_IMPLEMENTATION = "pagedinfer_paged"


@dataclass
class StepContext:
    """Per-forward state shared by all layers."""

    metadata: AttentionMetadata
    key_caches: list[torch.Tensor]  # one [num_blocks, block_size, kv_heads, head_dim] view per layer
    value_caches: list[torch.Tensor]
    layers_seen: set[int] = field(default_factory=set)  # checked after the forward: our attention really ran


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None,
                            scaling: float | None = None, dropout: float = 0.0,
                            sliding_window: int | None = None, pagedinfer_step: StepContext | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:
    if pagedinfer_step is None:
        raise RuntimeError("pagedinfer attention called without a step context")
    layer = module.layer_idx
    ctx = pagedinfer_step
    ctx.layers_seen.add(layer)
    q = query[0].transpose(0, 1)  # [tokens, heads, head_dim]
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    k_cache, v_cache = ctx.key_caches[layer], ctx.value_caches[layer]
    dispatch.write_kv(k, v, k_cache, v_cache, ctx.metadata.slot_mapping)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = dispatch.paged_attention(q.contiguous(), k_cache, v_cache, ctx.metadata, scale,
                                   sliding_window=sliding_window or None)
    return out.unsqueeze(0), None


def register() -> str:
    """Register the paged attention with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
