"""One GEMM for q, k and v and one for gate and up (CPU, Llama-family decoders), as vLLM's model code runs.

transformers' Llama-family attention multiplies the same hidden states by
three weights (q_proj, k_proj, v_proj) and its MLP by two (gate_proj,
up_proj). At decode sizes (a few dozen rows, one thread) one GEMM over the
concatenated weight is cheaper than three: one weight pass, one call, one
output buffer (oneDNN packed, one thread, the 125M model's q/k/v: fp32 1.42x
at M=1, 1.16x at M=16, 1.07x at M=48, on a par from M=256; bf16 1.66x, 1.34x,
1.13x; gate/up 1.11-1.15x at M=1, on a par beyond: `bench/cpu_linear.py --fused`). `fuse_projections` replaces, in place:

- an attention module's q_proj, k_proj, v_proj by one `qkv_proj` (an
  nn.Linear over the rows of the three weights, then of the three biases),
  and its forward by `_attention_forward`, which splits the output into
  q, k and v views;
- an MLP's gate_proj, up_proj by one `gate_up_proj` and its forward by
  `_mlp_forward`.

Invariants:
- the three (two) originals are removed from the module: only the fused
  weight holds their values (one copy: parameter bytes and the sizing's
  `weight_bytes` are unchanged, up to nothing); `engine/cpu/linear.py`
  then packs the fused nn.Linear like any other;
- only modules of the classes in `ATTENTION_SLIDING_WINDOW` / `MLP_CLASSES`
  are fused: their forwards are the same computation as `_attention_forward`
  / `_mlp_forward` (tests/engine/test_fused_projections.py compares logits
  per architecture); any other class (Phi-3 has its own fused qkv_proj and
  gate_up_proj already) is left as it is;
- the weights must be plain nn.Linear on one device (a tensor-parallel
  rank's column shards are: each rank fuses its own heads);
- the results equal the unfused layers' within fp32 rounding (a GEMM over
  more output columns may block its inner loop differently).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

# the attention classes whose forward `_attention_forward` reproduces -> the sliding window each passes
ATTENTION_SLIDING_WINDOW: dict[str, Callable[[nn.Module], int | None]] = {
    "LlamaAttention": lambda m: None,
    "MistralAttention": lambda m: getattr(m.config, "sliding_window", None),
    "Qwen2Attention": lambda m: m.sliding_window,
    "Qwen3Attention": lambda m: m.sliding_window,  # with q_norm / k_norm on each head before RoPE
}
MLP_CLASSES = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")  # down(act(gate(x)) * up(x))


@dataclass(frozen=True)
class FusionReport:
    """What `fuse_projections` did to a model."""

    qkv: tuple[str, ...]  # attention modules whose q/k/v projections are now one qkv_proj
    gate_up: tuple[str, ...]  # MLP modules whose gate/up projections are now one gate_up_proj


def _concatenated(linears: list[nn.Linear]) -> nn.Linear | None:
    """One nn.Linear whose output is the outputs of `linears` side by side (None: they cannot be fused)."""
    if not all(type(m) is nn.Linear for m in linears):
        return None
    weights = [m.weight for m in linears]
    biases = [m.bias for m in linears]
    if len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1 or len({b is None for b in biases}) != 1:
        return None
    out_features = sum(w.shape[0] for w in weights)
    fused = nn.Linear(
        weights[0].shape[1], out_features, bias=biases[0] is not None, device="meta", dtype=weights[0].dtype
    )
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat([w.detach() for w in weights]), requires_grad=False)
        if biases[0] is not None:
            fused.bias = nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)
    return fused


def _replace(module: nn.Module, names: tuple[str, ...], fused_name: str) -> tuple[int, ...] | None:
    """Swap module's `names` linears for one `fused_name` linear; their output sizes (None: left as is)."""
    linears = [getattr(module, n, None) for n in names]
    fused = _concatenated(linears)
    if fused is None:
        return None
    sizes = tuple(m.out_features for m in linears)
    for n in names:
        delattr(module, n)
    setattr(module, fused_name, fused)
    return sizes


def attention_function(module: nn.Module) -> Callable:
    """What transformers' own layer calls: the registry's function for the module's attention implementation,
    eager for "eager" (`get_interface` from transformers 4.57; 4.56's layers index the registry)."""
    functions, name = module.attention_functions, module.config._attn_implementation
    if hasattr(functions, "get_interface"):
        return functions.get_interface(name, module.eager_attention)
    return module.eager_attention if name == "eager" else functions[name]


def _attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    cache=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Llama-family attention forward with q, k, v split from one GEMM."""
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query, key, value = self.qkv_proj(hidden_states).split(self.qkv_sizes, dim=-1)
    query, key, value = query.view(hidden_shape), key.view(hidden_shape), value.view(hidden_shape)
    if self.qk_norms:
        query, key = self.q_norm(query), self.k_norm(key)
    query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    cos, sin = position_embeddings
    query, key = self.apply_rotary_pos_emb(query, key, cos, sin)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
    attention = attention_function(self)
    out, weights = attention(
        self,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        sliding_window=self.fused_sliding_window,
        **kwargs,
    )
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(act(gate(x)) * up(x)) with gate and up split from one GEMM."""
    gate, up = self.gate_up_proj(x).split(self.gate_up_sizes, dim=-1)
    return self.down_proj(self.act_fn(gate) * up)


def _fuse_attention(module: nn.Module) -> bool:
    sliding_window = ATTENTION_SLIDING_WINDOW[type(module).__name__](module)
    modeling = sys.modules[type(module).__module__]
    sizes = _replace(module, ("q_proj", "k_proj", "v_proj"), "qkv_proj")
    if sizes is None:
        return False
    module.qkv_sizes = sizes
    module.qk_norms = hasattr(module, "q_norm")
    module.fused_sliding_window = sliding_window
    module.apply_rotary_pos_emb = modeling.apply_rotary_pos_emb
    module.eager_attention = modeling.eager_attention_forward
    module.attention_functions = modeling.ALL_ATTENTION_FUNCTIONS
    module.forward = types.MethodType(_attention_forward, module)
    return True


def _fuse_mlp(module: nn.Module) -> bool:
    sizes = _replace(module, ("gate_proj", "up_proj"), "gate_up_proj")
    if sizes is None:
        return False
    module.gate_up_sizes = sizes
    module.forward = types.MethodType(_mlp_forward, module)
    return True


def fuse_projections(model: nn.Module) -> FusionReport:
    """Fuse, in place, the q/k/v and gate/up projections of every supported module (see the invariants)."""
    qkv, gate_up = [], []
    for name, module in list(model.named_modules()):
        kind = type(module).__name__
        if kind in ATTENTION_SLIDING_WINDOW and _fuse_attention(module):
            qkv.append(name)
        elif kind in MLP_CLASSES and _fuse_mlp(module):
            gate_up.append(name)
    return FusionReport(tuple(qkv), tuple(gate_up))
