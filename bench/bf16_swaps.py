"""One piece of pagedinfer's bfloat16 forward computed in float32, for `bf16_closeness.py --swaps`.

Each swap takes the piece's bf16 inputs, computes it in float32 and rounds
its output to bf16 once (as vLLM's CPU ops do), leaving every other piece as
the engine runs it; "logits" keeps the LM head's output in float32. They
patch transformers' Llama modules or pagedinfer's modules in the process that
builds the engine, before it is built (a study tool: never imported by the
engine or the tests).

- linear:    transformers' plain nn.Linear (F.linear) instead of oneDNN's packed GEMM
- fused:     q/k/v and gate/up left as transformers' separate projections
- attention: the paged attention kernel on float32 copies of q and the KV cache
- norm:      RMSNorm with the weight multiplied in float32 (transformers rounds x to bf16 first)
- rotary:    float32 cos/sin and rotation (transformers rounds cos/sin to bf16 and rotates in bf16)
- act:       silu(gate) * up in float32 (transformers rounds silu's output, then the product)
- logits:    the LM head in float32 (transformers' bf16 GEMM rounds the logits to bf16)
"""

from __future__ import annotations

import os

import torch
from torch import nn

SWAPS = ("linear", "fused", "attention", "norm", "rotary", "act", "logits")


def _norm() -> None:
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * x).to(hidden_states.dtype)

    modeling_llama.LlamaRMSNorm.forward = forward


def _rotary() -> None:
    from transformers.models.llama import modeling_llama

    rotary_forward = modeling_llama.LlamaRotaryEmbedding.forward
    rotate_half = modeling_llama.rotate_half

    def cos_sin(self, x: torch.Tensor, position_ids: torch.Tensor):
        return rotary_forward(self, x.float(), position_ids)  # its dtype is only the cast's target

    def apply(q, k, cos, sin, unsqueeze_dim: int = 1):
        cos, sin = cos.float().unsqueeze(unsqueeze_dim), sin.float().unsqueeze(unsqueeze_dim)
        qf, kf = q.float(), k.float()
        return (qf * cos + rotate_half(qf) * sin).to(q.dtype), (kf * cos + rotate_half(kf) * sin).to(k.dtype)

    modeling_llama.LlamaRotaryEmbedding.forward = cos_sin
    modeling_llama.apply_rotary_pos_emb = apply


def _act() -> None:
    from transformers.models.llama import modeling_llama

    from pagedinfer.engine.cpu import fused_projections

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.gate_up_sizes, dim=-1)
        return self.down_proj((nn.functional.silu(gate.float()) * up.float()).to(x.dtype))

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj((nn.functional.silu(self.gate_proj(x).float()) * self.up_proj(x).float()).to(x.dtype))

    fused_projections._mlp_forward = fused
    modeling_llama.LlamaMLP.forward = plain


def _attention() -> None:
    from pagedinfer.engine import attention

    dispatch = attention.dispatch
    paged_attention = dispatch.paged_attention

    class Float32Attention:  # the module's `dispatch`, with paged_attention on float32 copies
        def __getattr__(self, name):
            return getattr(dispatch, name)

        @staticmethod
        def paged_attention(q, k_cache, v_cache, meta, scale, **kwargs):
            return paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale, **kwargs).to(q.dtype)

    attention.dispatch = Float32Attention()


class _Float32Head(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight32 = weight.detach().float().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.float(), self.weight32)


def _logits() -> None:
    from pagedinfer.engine.runner import loading

    pack = loading.pack_linear_weights

    def head_then_pack(model: nn.Module):
        model.lm_head = _Float32Head(model.lm_head.weight)
        return pack(model)

    loading.pack_linear_weights = head_then_pack


def _fused() -> None:
    from pagedinfer.engine.cpu.fused_projections import FusionReport
    from pagedinfer.engine.runner import loading

    loading.fuse_projections = lambda model: FusionReport((), ())


def _linear() -> None:
    os.environ["PAGEDINFER_CPU_LINEAR"] = "aten"


_APPLY = {
    "linear": _linear,
    "fused": _fused,
    "attention": _attention,
    "norm": _norm,
    "rotary": _rotary,
    "act": _act,
    "logits": _logits,
}


def apply_swaps(names: tuple[str, ...]) -> None:
    """Patch this process so that the engine built next runs `names` in float32 (ValueError for an unknown one)."""
    unknown = [n for n in names if n not in _APPLY]
    if unknown:
        raise ValueError(f"swaps: unknown {', '.join(unknown)}; expected some of {', '.join(SWAPS)}")
    for name in names:
        _APPLY[name]()
