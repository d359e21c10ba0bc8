"""The Llama-family decoder on CPU with its small ops native and the residual carried between layers, as vLLM runs it.

transformers' decoder layer spends a fifth to a third of a CPU step
(bench/throughput.py --breakdown, "model other") outside its GEMMs and
attention: RMSNorm as eight torch ops with float32 temporaries, the residual
adds, RoPE as slices, a cat, a negation and muls/adds on q and on k, SiLU and
the multiply, Qwen3's per-head q/k norms, and the Python dispatch of each.
`fuse_layers` replaces, in place, the decoder model's forward by
`_model_forward`, which runs every layer as `_layer_forward`: one native op
each (`pagedinfer.kernels.cpu.layer_ops`) for

- the pre-attention norm: `rms_norm` in the first layer, then
  `fused_add_rms_norm` (residual += the previous MLP's output, x = norm of the float32 sum);
- Qwen3's q/k norms and RoPE: `rotary_embedding` in place on the qkv GEMM's
  output (cos/sin from `RotaryCache`, the model's own rotary module's values);
- the post-attention norm: `fused_add_rms_norm` (residual += attention output);
- `silu_and_mul` on the gate_up GEMM's output (a long step's MLP in row
  chunks, `mlp_chunks.py`: its gate_up output would otherwise be a fresh
  `mmap`, page-faulted in at every layer);

and the final norm as one more `fused_add_rms_norm`. The attention call is the
engine's own (`engine.attention.paged_attention_forward`: eager, or the
compiled forward's opaque op, looked up in transformers' attention registry
as its own layers do, once per forward), so `--compile` traces this forward too.
Eager, when the function the registry holds has a packed form (its `packed`
attribute: the engine's own, `attention.attend_packed`), each layer calls that on
`[tokens, heads, head_dim]` views of the qkv GEMM's output: the same kernels on
the same tensors, without transformers' layout round trip (a view, a transpose
and back per q, k and v).
Each layer's norms, head counts and projections are bound once, at fusion
(`layer_plan.py`: the GEMM op with its packed weight and bias, no
`Module.__call__` and no attribute walks per layer and step).
`causal_lm_logits` runs a fused model's whole step as transformers'
`*ForCausalLM.forward` does (decoder, rows kept, lm_head), without its
wrappers and output dataclasses.

Invariants:
- only decoders of `MODEL_CLASSES` whose every layer is of `LAYER_CLASSES`
  with q/k/v and gate/up fused (`fused_projections`, run first), a SiLU MLP,
  full-width RoPE and the engine's paged attention are fused; anything else
  is left as it is (the report says why);
- float32 and bfloat16 only, and only when the native library builds: without
  a compiler `build.load` warns once and transformers' forward stays (the torch path);
- float32 logits equal the unfused model's up to float32 rounding; in bfloat16
  the ops compute in float32 and round once (transformers rounds after each op:
  RoPE's cos/sin, its products and sum, the norm before and after the weight
  multiply), so the logits are as close to float32's or closer
  (tests/engine/test_fused_layers.py; RoPE in bf16 was what kept our bf16 further
  from fp32 than vLLM's in issue 16's bf16 closeness study);
- the embedding output and each layer's o_proj/down_proj output are updated in
  place (they are dead after, as in vLLM); model weights are never written;
- a tensor-parallel rank runs the same forward on its own heads (the head counts
  come from its qkv_proj's split; norms and RoPE are per head or replicated).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch import nn

from pagedinfer.engine.attention import ATTN_IMPLEMENTATION
from pagedinfer.engine.cpu.fused_projections import attention_function
from pagedinfer.engine.cpu.layer_plan import DecoderPlan, LayerPlan, Projection, plan_decoder, projection
from pagedinfer.engine.cpu.mlp_chunks import MLP_CHUNK_BYTES, chunked_mlp
from pagedinfer.kernels.cpu import layer_ops

MODEL_CLASSES = ("LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model")
# their causal LMs: forward = decoder, hidden[:, logits_to_keep], lm_head (no logit scaling or soft-capping)
CAUSAL_LM_CLASSES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")


@dataclass(frozen=True)
class LayerFusionReport:
    """What `fuse_layers` did to a model."""

    fused: bool  # the decoder's forward is now `_model_forward`
    reason: str  # why not, when not ("" when fused)


def rotary_cos_sin(rotary_emb: nn.Module, num_positions: int) -> torch.Tensor:
    """`[num_positions, head_dim]` float32, row p = [cos | sin] of position p's head_dim / 2 frequencies.

    The values are what the model's own rotary module returns for position p (its
    inv_freq and attention_scaling: default, linear, llama3 and yarn RoPE alike), in float32.
    """
    device = rotary_emb.inv_freq.device
    positions = torch.arange(num_positions, device=device)[None]
    with torch.inference_mode():
        cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float32, device=device), positions)
    half = cos.shape[-1] // 2
    return torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1).float().contiguous()


def _unfusable_layer(layer: nn.Module) -> str:
    """Why `layer` cannot run as `_layer_forward` ("" when it can)."""
    if type(layer).__name__ not in LAYER_CLASSES:
        return f"layer class {type(layer).__name__}"
    attn, mlp = layer.self_attn, layer.mlp
    if not hasattr(attn, "qkv_proj") or not hasattr(mlp, "gate_up_proj"):
        return "q/k/v or gate/up projections not fused"
    if getattr(attn.config, "hidden_act", None) != "silu":
        return f"activation {attn.config.hidden_act!r}"
    if any(size % attn.head_dim for size in attn.qkv_sizes):
        return "q/k/v sizes not whole heads"
    return ""


def _unfusable(decoder: nn.Module, dtype: torch.dtype) -> str:
    """Why `decoder` cannot run as `_model_forward` ("" when it can)."""
    reason = unfusable_structure(decoder)
    if reason:
        return reason
    if not layer_ops.available(dtype):
        return f"no native layer ops for {dtype} (float32 and bfloat16 with a C++ compiler)"
    return ""


def unfusable_structure(decoder: nn.Module) -> str:
    """Why `decoder`'s layers are not the fused decoders' shape ("" when they are): a class of `MODEL_CLASSES`
    with every layer of `LAYER_CLASSES`, q/k/v and gate/up fused, SiLU, full-width RoPE and the engine's attention
    (the CPU's fused layers and the GPU's Triton decoder, `engine/gpu_forward/`, run the same plan)."""
    if type(decoder).__name__ not in MODEL_CLASSES:
        return f"model class {type(decoder).__name__}"
    if decoder.config._attn_implementation != ATTN_IMPLEMENTATION:
        return f"attention implementation {decoder.config._attn_implementation!r}"
    reasons = [r for r in map(_unfusable_layer, decoder.layers) if r]
    if reasons:
        return reasons[0]
    rotary_width = 2 * decoder.rotary_emb.inv_freq.numel()
    if rotary_width != decoder.layers[0].self_attn.head_dim:
        return f"partial RoPE ({rotary_width} of {decoder.layers[0].self_attn.head_dim} dims)"
    return ""


def _layer_forward(
    plan: LayerPlan,
    positions: torch.Tensor,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    cos_sin: torch.Tensor,
    step,
    attention,
    packed,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer on packed `[tokens, hidden]` rows; returns (MLP output, residual) for the next."""
    weight, eps = plan.input_norm
    if residual is None:
        residual, hidden = hidden, layer_ops.rms_norm(hidden, weight, eps)
    else:
        layer_ops.fused_add_rms_norm(hidden, residual, weight, eps)
    qkv = plan.qkv.fn(hidden, *plan.qkv.args)
    head_dim = plan.head_dim
    if plan.qk_norms is not None:
        layer_ops.rotary_embedding(
            positions, qkv, cos_sin, plan.num_query_heads, plan.num_key_heads, head_dim, *plan.qk_norms
        )
    else:
        layer_ops.rotary_embedding(positions, qkv, cos_sin, plan.num_query_heads, plan.num_key_heads, head_dim)
    tokens = qkv.shape[0]
    query, key, value = qkv.split(plan.qkv_sizes, dim=-1)
    if packed is not None:  # the attention's packed form (paged_attention_forward's scale and window)
        out = packed(
            step,
            plan.layer_idx,
            query.view(tokens, -1, head_dim),
            key.view(tokens, -1, head_dim),
            value.view(tokens, -1, head_dim),
            plan.scale,
            plan.sliding_window,
        )
    else:
        query, key, value = (t.view(1, tokens, -1, head_dim).transpose(1, 2) for t in (query, key, value))
        out, _ = attention(
            plan.attn,
            query,
            key,
            value,
            None,
            dropout=0.0,
            scaling=plan.scaling,
            sliding_window=plan.sliding_window,
            pagedinfer_step=step,
        )
    hidden = plan.o.fn(out.reshape(tokens, -1), *plan.o.args)
    weight, eps = plan.post_norm
    layer_ops.fused_add_rms_norm(hidden, residual, weight, eps)
    return chunked_mlp(hidden, plan.gate_up, plan.down, plan.mlp_max_rows), residual


def _model_forward(
    self: nn.Module,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache=None,
    inputs_embeds: torch.Tensor | None = None,
    use_cache: bool | None = None,
    **kwargs,
):
    """The decoder over one packed step (`[1, tokens]` ids and positions); `last_hidden_state` as transformers'."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    if attention_mask is not None or cache is not None or use_cache:
        raise ValueError("the fused CPU decoder runs the engine's packed steps: no attention_mask, cache or use_cache")
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("give exactly one of input_ids or inputs_embeds")
    embeds = self.fused_plan.embed(input_ids) if inputs_embeds is None else inputs_embeds
    if embeds.shape[0] != 1:
        raise ValueError(f"the fused CPU decoder runs packed steps (batch 1), got batch {embeds.shape[0]}")
    hidden = embeds[0] if inputs_embeds is None else embeds[0].clone()  # updated in place: never the caller's
    tokens = hidden.shape[0]
    positions = (
        torch.arange(tokens, device=hidden.device) if position_ids is None else position_ids.reshape(-1)
    ).contiguous()
    hidden = _decoder_hidden(self, hidden, positions, kwargs.get("pagedinfer_step"))
    return BaseModelOutputWithPast(last_hidden_state=hidden[None])


def _decoder_hidden(decoder: nn.Module, hidden: torch.Tensor, positions: torch.Tensor, step) -> torch.Tensor:
    """Every layer and the final norm over packed `[tokens, hidden]` embeddings (updated in place)."""
    plan: DecoderPlan = decoder.fused_plan
    # looked up as transformers does (what the registry holds now: the engine's, or a bench's wrapper of it),
    # once per forward; eager, its packed form when it has one
    first = plan.layers[0].attn
    attention = attention_function(first)
    packed = getattr(attention, "packed", None) if step is not None and not torch.compiler.is_compiling() else None
    cos_sin = decoder.fused_cos_sin
    residual = None
    for layer in plan.layers:
        hidden, residual = _layer_forward(layer, positions, hidden, residual, cos_sin, step, attention, packed)
    weight, eps = plan.final_norm
    layer_ops.fused_add_rms_norm(hidden, residual, weight, eps)
    return hidden


def causal_lm_logits(
    model: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, logits_index: torch.Tensor, step
) -> torch.Tensor:
    """`model(input_ids=input_ids[None], position_ids=positions[None], use_cache=False, logits_to_keep=logits_index,
    pagedinfer_step=step).logits[0]` for a model `fuse_layers` fused (`fuses_causal_lm`): the same ops on the
    same tensors, `[len(logits_index), vocab]` (packed `[tokens]` ids and positions in)."""
    decoder = model.model
    hidden = _decoder_hidden(decoder, decoder.fused_plan.embed(input_ids), positions.contiguous(), step)
    head: Projection = model.fused_lm_head
    return head.fn(hidden[logits_index], *head.args)


def fuses_causal_lm(model: nn.Module) -> bool:
    """Whether `causal_lm_logits` runs `model`: a causal LM of `CAUSAL_LM_CLASSES` whose decoder is fused."""
    decoder = getattr(model, "model", None)
    return (
        type(model).__name__ in CAUSAL_LM_CLASSES
        and decoder is not None
        and getattr(decoder.forward, "__func__", None) is _model_forward
        and "fused_lm_head" in vars(model)
    )


def fuse_layers(model: nn.Module, num_positions: int, mlp_chunk_bytes: int = MLP_CHUNK_BYTES) -> LayerFusionReport:
    """Run `model`'s decoder as `_model_forward` (see the invariants); RoPE for positions < `num_positions`; the
    MLP of a long step in row chunks whose gate_up output fits `mlp_chunk_bytes` (`mlp_chunks.py`)."""
    decoder = model.get_decoder()
    if decoder is None:  # transformers 4.56: a *ForCausalLM's get_decoder asks its decoder for one, which has none
        decoder = getattr(model, "model", None)
    if not isinstance(decoder, nn.Module):
        return LayerFusionReport(False, "no decoder module")
    reason = _unfusable(decoder, next(decoder.parameters()).dtype)
    if reason:
        return LayerFusionReport(False, reason)
    decoder.fused_cos_sin = rotary_cos_sin(decoder.rotary_emb, num_positions)
    decoder.fused_plan = plan_decoder(decoder, mlp_chunk_bytes)
    if type(model).__name__ in CAUSAL_LM_CLASSES and isinstance(getattr(model, "lm_head", None), nn.Module):
        model.fused_lm_head = projection(model.lm_head)
    decoder.forward = types.MethodType(_model_forward, decoder)
    return LayerFusionReport(True, "")
