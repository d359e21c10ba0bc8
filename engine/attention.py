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
    # the dispatch's kernels for this step's device, chosen at its first layer (PAGEDINFER_ATTENTION is read
    # once per step, not twice per layer)
    kernels: dispatch.Kernels | None = None


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    pagedinfer_step: StepContext | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if torch.compiler.is_compiling():  # one opaque op in the graph; the step comes from its current_step
        from pagedinfer.engine.cpu.attention_op import paged_attention

        return paged_attention(query, key, value, module.layer_idx, scale, sliding_window or None), None
    if pagedinfer_step is None:
        raise RuntimeError("pagedinfer attention called without a step context")
    return attend_layer(pagedinfer_step, module.layer_idx, query, key, value, scale, sliding_window or None), None


def attend_layer(
    ctx: StepContext,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Write layer `layer`'s K/V of the step, attend over the cache; transformers' layouts in and out."""
    # [1, heads, tokens, head_dim] -> [tokens, heads, head_dim]
    out = attend_packed(
        ctx, layer, query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), scale, sliding_window
    )
    return out.unsqueeze(0)


def attend_packed(
    ctx: StepContext,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """`attend_layer` in the packed layout: q/k/v `[tokens, heads, head_dim]` (unit stride along head_dim)
    in, `[tokens, heads, v_head_dim]` out (the fused CPU decoder calls it with views of its qkv GEMM's output)."""
    dispatch.check_sliding_window(sliding_window)
    ctx.layers_seen.add(layer)
    kernels = ctx.kernels
    if kernels is None:
        kernels = ctx.kernels = dispatch.kernels_for(query.device)
    k_cache, v_cache = ctx.key_caches[layer], ctx.value_caches[layer]
    kernels.write_kv(key, value, k_cache, v_cache, ctx.metadata.slot_mapping)
    return kernels.paged_attention(query.contiguous(), k_cache, v_cache, ctx.metadata, scale, sliding_window)


# the packed form of the registered function: the fused CPU decoder calls it instead (a wrapper registered in
# its place, as bench/breakdown.py's profiling label, may carry its own `packed`; one without is called as is)
paged_attention_forward.packed = attend_packed


def register() -> str:
    """Register the paged attention with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
