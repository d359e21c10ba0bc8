"""What the fused CPU decoder calls per layer, bound once at load: weights, norms, head counts and each projection's op.

`fused_layers._layer_forward` used to walk the modules at every layer of every
step: `layer.self_attn.qkv_proj(...)` is an `nn.Module.__call__` (hooks
machinery, then `forward`, then the op) and each `.weight`, `.self_attn`,
`.variance_epsilon` a `Module.__getattr__` (tiny model, 192 requests: 10206
`_call_impl` and 40257 `__getattr__` calls per run). `plan_decoder` resolves
all of it once, when `fuse_layers` fuses the model: a `LayerPlan` per layer
holds the tensors and numbers its forward reads, and a `Projection` per
linear holds the function and arguments that compute it.

Invariants:
- built after `fuse_projections` and `pack_linear_weights` (the engine's
  order, `ModelRunner.__init__`); it holds references to the model's own
  parameters, never copies: weights updated in place are seen, a module
  replaced after fusion is not (the engine replaces none);
- a projection computes exactly what its module's forward does: a
  `PackedLinear` -> `linear.packed_linear(x, weight, bias)` (the opaque op when
  compiling), a plain nn.Linear (PAGEDINFER_CPU_LINEAR=aten, a tied LM head)
  -> `F.linear(x, weight, bias)`, any other module (a tensor-parallel shard,
  whose all-reduce is in its forward) -> its bound `forward`; only
  `Module.__call__` is skipped, and the engine registers no hooks on these
  modules;
- a tensor-parallel rank's plan has its own heads (sizes from its qkv_proj's split).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pagedinfer.engine.cpu.linear import PackedLinear, packed_linear
from pagedinfer.engine.cpu.mlp_chunks import MLP_CHUNK_BYTES, max_chunk_rows


@dataclass(frozen=True, slots=True)
class Projection:
    """One linear layer as `fn(x, *args)`."""

    fn: Callable[..., torch.Tensor]
    args: tuple


def projection(module: nn.Module) -> Projection:
    """How to compute `module(x)` without `Module.__call__` (see the invariants)."""
    if type(module) is PackedLinear:
        return Projection(packed_linear, (module.weight, module.bias))
    if type(module) is nn.Linear:
        return Projection(nn.functional.linear, (module.weight, module.bias))
    return Projection(module.forward, ())


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """One decoder layer's tensors and numbers, as `_layer_forward` reads them."""

    attn: nn.Module  # the attention module (the non-packed attention function takes it)
    layer_idx: int
    input_norm: tuple[torch.Tensor, float]  # (weight, eps) of input_layernorm
    post_norm: tuple[torch.Tensor, float]  # (weight, eps) of post_attention_layernorm
    qkv: Projection
    qkv_sizes: tuple[int, int, int]  # q, k, v columns of qkv's output
    num_query_heads: int
    num_key_heads: int
    head_dim: int
    qk_norms: tuple[torch.Tensor, torch.Tensor, float] | None  # Qwen3's (q weight, k weight, eps)
    scaling: float | None  # the module's own (None: the attention's default)
    scale: float  # what the packed attention gets: scaling, or head_dim ** -0.5
    sliding_window: int | None  # None or positive
    o: Projection
    gate_up: Projection
    down: Projection
    mlp_max_rows: int  # rows per MLP chunk (mlp_chunks.py: its gate_up output fits the chunk bytes)


@dataclass(frozen=True, slots=True)
class DecoderPlan:
    """Every layer's plan (the config's `num_hidden_layers` first layers) and the final norm."""

    layers: tuple[LayerPlan, ...]
    final_norm: tuple[torch.Tensor, float]
    embed: Callable[[torch.Tensor], torch.Tensor]  # the embedding module's forward


def _norm(module: nn.Module) -> tuple[torch.Tensor, float]:
    return module.weight, module.variance_epsilon


def plan_layer(layer: nn.Module, mlp_chunk_bytes: int = MLP_CHUNK_BYTES) -> LayerPlan:
    attn, mlp = layer.self_attn, layer.mlp
    gate_up_weight = mlp.gate_up_proj.weight  # [out, in], dense or packed (same shape and dtype)
    head_dim = attn.head_dim
    q_size, k_size, v_size = attn.qkv_sizes
    qk_norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon) if attn.qk_norms else None
    return LayerPlan(
        attn=attn,
        layer_idx=attn.layer_idx,
        input_norm=_norm(layer.input_layernorm),
        post_norm=_norm(layer.post_attention_layernorm),
        qkv=projection(attn.qkv_proj),
        qkv_sizes=(q_size, k_size, v_size),
        num_query_heads=q_size // head_dim,
        num_key_heads=k_size // head_dim,
        head_dim=head_dim,
        qk_norms=qk_norms,
        scaling=attn.scaling,
        scale=attn.scaling if attn.scaling is not None else head_dim**-0.5,
        sliding_window=attn.fused_sliding_window or None,
        o=projection(attn.o_proj),
        gate_up=projection(mlp.gate_up_proj),
        down=projection(mlp.down_proj),
        mlp_max_rows=max_chunk_rows(gate_up_weight.shape[0] * gate_up_weight.element_size(), mlp_chunk_bytes),
    )


def plan_decoder(decoder: nn.Module, mlp_chunk_bytes: int = MLP_CHUNK_BYTES) -> DecoderPlan:
    return DecoderPlan(
        tuple(plan_layer(layer, mlp_chunk_bytes) for layer in decoder.layers[: decoder.config.num_hidden_layers]),
        _norm(decoder.norm),
        decoder.embed_tokens.forward,
    )
