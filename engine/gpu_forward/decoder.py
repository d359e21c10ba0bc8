"""A decoder step as our own kernels: the GPU's equivalent of the CPU's fused layers (`engine/cpu/fused_layers.py`).

transformers loads and defines the model; `TritonDecoder` runs its weights.
At load `engine/cpu/fused_projections.py` fuses q/k/v into one GEMM and gate/up
into one (the weights concatenated once, the originals dropped) and
`engine/cpu/layer_plan.py` binds each layer's tensors and projections (the same
plan the CPU's fused layers run). A step over the packed `[tokens]` ids is then,
per layer:

    rms_norm (first layer) / add + rms_norm     kernels/rms_norm.py
    qkv GEMM                                    F.linear over the fused weight (bias: Qwen2)
    q/k norms (Qwen3) + RoPE + paged KV write   kernels/rotary_kv.py (slot -1: nothing written)
    paged attention                             kernels.dispatch (Triton on CUDA)
    o GEMM
    add + rms_norm                              kernels/rms_norm.py
    gate_up GEMM, SiLU x up, down GEMM          kernels/silu_mul.py

and the final add + norm and the LM head on the kept rows only.

Invariants:
- no host sync inside a step: no `.item()`, `.tolist()` or branch on a tensor's
  value; what varies per step on the host (the metadata's host lists: how many
  decodes, the longest query) only picks kernels and launch sizes, as in the
  module path;
- float32 logits equal the module path's up to float32 rounding (greedy output
  equals transformers' `generate`: tests/engine/test_gpu_forward.py); in
  bfloat16 each kernel computes in float32 and rounds once;
- the embedding output and each layer's o/down outputs are dead after use: the
  residual is updated in place in the embedding output's buffer; weights are never written;
- every layer of the plan runs, with the engine's paged caches (layer i: `key_caches[i]`).
"""

from __future__ import annotations

import torch

from pagedinfer.engine.cpu.layer_plan import DecoderPlan, Projection
from pagedinfer.kernels import dispatch
from pagedinfer.kernels.metadata import AttentionMetadata
from pagedinfer.kernels.rms_norm import rms_norm
from pagedinfer.kernels.rotary_kv import rotary_write_kv
from pagedinfer.kernels.silu_mul import silu_mul


class TritonDecoder:
    """`plan`'s layers, `cos_sin` RoPE table and `lm_head` as one step: `(ids, positions, metadata, caches,
    rows) -> logits [len(rows), vocab]` (the forward the runner, and the CUDA graphs that wrap it, call)."""

    def __init__(self, plan: DecoderPlan, cos_sin: torch.Tensor, lm_head: Projection) -> None:
        self.plan = plan
        self.cos_sin = cos_sin
        self.lm_head = lm_head
        self.num_layers = len(plan.layers)

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer over the packed step; (last MLP output, residual) `[tokens, hidden]`, the final norm not applied."""
        hidden = self.plan.embed(input_ids)
        residual = None
        attention = dispatch.kernels_for(hidden.device).paged_attention
        slots = metadata.slot_mapping
        tokens = hidden.shape[0]
        for layer in self.plan.layers:
            weight, eps = layer.input_norm
            normed, residual = rms_norm(hidden, weight, eps, residual)
            qkv = layer.qkv.fn(normed, *layer.qkv.args)
            key_cache, value_cache = key_caches[layer.layer_idx], value_caches[layer.layer_idx]
            rotary_write_kv(
                qkv,
                positions,
                self.cos_sin,
                key_cache,
                value_cache,
                slots,
                layer.num_query_heads,
                layer.num_key_heads,
                layer.head_dim,
                layer.qk_norms,
            )
            query = qkv[:, : layer.qkv_sizes[0]].view(tokens, layer.num_query_heads, layer.head_dim)
            out = attention(query, key_cache, value_cache, metadata, layer.scale, layer.sliding_window)
            hidden = layer.o.fn(out.view(tokens, -1), *layer.o.args)
            weight, eps = layer.post_norm
            normed, residual = rms_norm(hidden, weight, eps, residual)
            gate_up = layer.gate_up.fn(normed, *layer.gate_up.args)
            hidden = layer.down.fn(silu_mul(gate_up), *layer.down.args)
        return hidden, residual

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        logits_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Logits `[len(logits_rows), vocab]` of the packed step `input_ids`/`positions` `[tokens]` (int64)."""
        hidden, residual = self.hidden(input_ids, positions, metadata, key_caches, value_caches)
        weight, eps = self.plan.final_norm
        normed, _ = rms_norm(hidden[logits_rows], weight, eps, residual[logits_rows])
        return self.lm_head.fn(normed, *self.lm_head.args)
