"""The decoder with native norms, RoPE and SiLU-and-multiply (engine/cpu/fused_layers.py): the unfused logits, per
architecture.

The engine's greedy tokens on the fused decoder equal transformers' generate for every architecture in
tests/engine/test_matches_transformers.py (the runner fuses on CPU); these are the model-level checks, on the
engine's own paged attention: a 30-token prefill (past the tiny Mistral's window of 24), then a step of one
decode and a 5-token chunk, through the same caches.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from torch import nn

from pagedinfer.engine import LLM
from pagedinfer.engine.attention import StepContext, register
from pagedinfer.engine.cpu.fused_layers import causal_lm_logits, fuse_layers, fuses_causal_lm, rotary_cos_sin
from pagedinfer.engine.cpu.fused_projections import fuse_projections
from pagedinfer.engine.cpu.linear import pack_linear_weights
from pagedinfer.engine.cpu.mlp_chunks import MLP_CHUNK_BYTES
from pagedinfer.engine.tiny_model import tiny_config
from pagedinfer.kernels.cpu import build, ops
from pagedinfer.kernels.metadata import build_attention_metadata

BLOCK_SIZE = 16
PROMPT = [5, 9, 11, 2, 40, 7, 63, 12, 90, 33, 7, 8, 300, 17, 250, 1, 77, 45, 2, 99, 101, 5, 6, 7, 8, 9, 10, 11, 12, 13]
# (token ids, seq_lens, query_lens, block tables): a prefill, then a decode of it beside a new 5-token sequence
STEPS = [(PROMPT, [30], [30], [[0, 1]]), ([42, 1, 2, 3, 4, 5], [31, 5], [1, 5], [[0, 1], [2]])]


def _model(
    arch: str, dtype: torch.dtype, fused_layers: bool, mlp_chunk_bytes: int = MLP_CHUNK_BYTES, **config
) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config(arch, **config), dtype=dtype, attn_implementation=register()
    ).eval()
    with torch.no_grad():  # decisive logits (engine/tiny_model.py's scale), and norm weights that are not all 1
        for _name, p in model.named_parameters():
            p.normal_(0.0, 0.15) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    fuse_projections(model)
    pack_linear_weights(model)
    if fused_layers:
        assert fuse_layers(model, num_positions=64, mlp_chunk_bytes=mlp_chunk_bytes).fused
    return model


def _model_logits(model: nn.Module, ids: list[int], positions: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return model(
        input_ids=torch.tensor([ids]), position_ids=positions[None], use_cache=False, pagedinfer_step=ctx
    ).logits[0]


def _lm_logits(model: nn.Module, ids: list[int], positions: torch.Tensor, ctx: StepContext) -> torch.Tensor:
    return causal_lm_logits(model, torch.tensor(ids), positions, torch.arange(len(ids)), ctx)


def _step_logits(model: nn.Module, forward=_model_logits) -> list[torch.Tensor]:
    """Every step's logits (all rows) through fresh paged caches."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype = next(model.parameters()).dtype
    caches = [
        torch.zeros(3, BLOCK_SIZE, config.num_key_value_heads, head_dim, dtype=dtype)
        for _ in range(2 * config.num_hidden_layers)
    ]
    out = []
    for ids, seq_lens, query_lens, tables in STEPS:
        meta = build_attention_metadata(seq_lens, query_lens, tables, BLOCK_SIZE)
        positions = torch.cat([torch.arange(s - q, s) for s, q in zip(seq_lens, query_lens)])
        ctx = StepContext(metadata=meta, key_caches=caches[::2], value_caches=caches[1::2])
        with torch.inference_mode():
            out.append(forward(model, ids, positions, ctx).float())
        assert len(ctx.layers_seen) == config.num_hidden_layers
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_fused_layers_give_the_unfused_logits_in_float32(arch):
    want = _step_logits(_model(arch, torch.float32, fused_layers=False))
    for got, expected in zip(_step_logits(_model(arch, torch.float32, fused_layers=True)), want):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_long_steps_mlp_in_row_chunks_gives_the_unchunked_logits(dtype):
    """engine/cpu/mlp_chunks.py: with chunks of 7 rows' gate_up output, the 30-token prefill's MLP runs in 5
    chunks of 6 rows and the 6-token step's in one: the same rows, the same logits."""
    width = tiny_config("llama").intermediate_size * 2
    chunked = _model("llama", dtype, fused_layers=True, mlp_chunk_bytes=7 * width * dtype.itemsize)
    assert {layer.mlp_max_rows for layer in chunked.model.fused_plan.layers} == {7}
    rows_seen = []
    gate_up = chunked.model.fused_plan.layers[0].gate_up
    object.__setattr__(
        chunked.model.fused_plan.layers[0],
        "gate_up",
        type(gate_up)(lambda x, *args: rows_seen.append(x.shape[0]) or gate_up.fn(x, *args), gate_up.args),
    )
    got = _step_logits(chunked, _lm_logits)
    assert rows_seen == [6] * 5 + [6]
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for got_step, expected in zip(got, _step_logits(_model("llama", dtype, fused_layers=True), _lm_logits)):
        torch.testing.assert_close(got_step, expected, **tolerance)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_causal_lm_logits_are_the_models_own_forward_bit_for_bit(arch):
    """The runner's eager step skips transformers' outer forward and the layout round trip of the attention call
    (the packed `attend_packed`): the same ops on the same tensors, so the same bits."""
    model = _model(arch, torch.float32, fused_layers=True)
    assert fuses_causal_lm(model)
    for got, expected in zip(_step_logits(model, _lm_logits), _step_logits(model, _model_logits)):
        assert torch.equal(got, expected)


def test_a_wrapper_registered_over_the_paged_attention_is_called_in_every_layer():
    """The fused decoder looks the attention up in transformers' registry once per forward and calls what it
    holds (a bench's profiling wrapper, say); only the engine's own function itself takes the packed path."""
    from transformers import AttentionInterface

    from pagedinfer.engine.attention import ATTN_IMPLEMENTATION, paged_attention_forward

    model = _model("llama", torch.float32, fused_layers=True)
    want = _step_logits(model, _lm_logits)
    calls = []

    def wrapper(module, *args, **kwargs):
        calls.append(module.layer_idx)
        return paged_attention_forward(module, *args, **kwargs)

    AttentionInterface.register(ATTN_IMPLEMENTATION, wrapper)
    try:
        got = _step_logits(model, _lm_logits)
    finally:
        register()
    assert calls == list(range(model.config.num_hidden_layers)) * len(STEPS)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_scaled_rope_is_the_rotary_modules_own():
    """llama3 and yarn RoPE: the table is what the module computes (inv_freq and attention_scaling reused)."""
    for rope in (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
            "rope_theta": 10000.0,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0},
    ):
        want = _step_logits(_model("llama", torch.float32, False, rope_parameters=rope))
        for got, expected in zip(_step_logits(_model("llama", torch.float32, True, rope_parameters=rope)), want):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    model = _model("llama", torch.float32, False, rope_parameters=rope)
    cos, sin = model.model.rotary_emb(torch.zeros(1), torch.tensor([[0, 5, 63]]))
    assert model.model.rotary_emb.attention_scaling != 1.0  # yarn scales cos and sin
    table = rotary_cos_sin(model.model.rotary_emb, 64)
    torch.testing.assert_close(table[[0, 5, 63]], torch.cat((cos[0, :, :8], sin[0, :, :8]), dim=-1), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_bf16_logits_are_as_close_to_float32_as_the_unfused_ones(arch):
    """One rounding per op instead of one per torch op: the fused bf16 logits are no further from the float32 ones
    (mostly the bf16 weights' and GEMMs' rounding: 11% of the largest logit at most here, fused or not)."""
    reference = _step_logits(_model(arch, torch.float32, fused_layers=False))
    unfused = _step_logits(_model(arch, torch.bfloat16, fused_layers=False))
    fused = _step_logits(_model(arch, torch.bfloat16, fused_layers=True))
    for want, plain, got in zip(reference, unfused, fused):
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0, atol=0.15 * scale)
        assert (got - want).abs().mean() <= 1.02 * (plain - want).abs().mean()


def test_other_models_and_dtypes_are_left_as_they_are():
    phi3 = transformers.AutoModelForCausalLM.from_config(tiny_config("phi3"), attn_implementation=register())
    report = fuse_layers(phi3, 64)
    assert not report.fused and report.reason == "model class Phi3Model"
    llama = transformers.AutoModelForCausalLM.from_config(tiny_config("llama"), attn_implementation=register())
    report = fuse_layers(llama, 64)  # q/k/v not fused first
    assert not report.fused and report.reason == "q/k/v or gate/up projections not fused"
    fuse_projections(llama)
    assert fuse_layers(llama.half(), 64).reason.startswith("no native layer ops for torch.float16")
    sdpa = transformers.AutoModelForCausalLM.from_config(tiny_config("llama"))
    fuse_projections(sdpa)
    assert fuse_layers(sdpa, 64).reason == "attention implementation 'sdpa'"


def test_the_engine_fuses_the_layers_on_cpu(tiny_llama):
    runner = LLM(model=str(tiny_llama), dtype="float32", device="cpu").llm_engine.runner
    assert runner.layer_fusion.fused and runner.model.model.fused_cos_sin.shape == (
        runner.max_position_embeddings,
        runner.head_dim,
    )


def test_without_a_compiler_the_decoder_stays_transformers_with_one_warning(monkeypatch, tmp_path):
    """As tests/kernels/test_cpu_fallback.py: the real library is loaded first, then the loader reset to fail."""
    assert ops.native_available()
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    model = _model("llama", torch.float32, fused_layers=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fuse_layers(model, 64)
    assert not report.fused and report.reason.startswith("no native layer ops for torch.float32")
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert str(caught[0].message).startswith(
        "pagedinfer: the native CPU kernels (attention, layer ops) could not be built"
    )
    assert "forward" not in vars(model.model)  # transformers' own forward: the torch path


def test_a_fused_step_calls_each_projection_op_directly_not_through_its_module():
    """The layers' ops are bound at fusion (engine/cpu/layer_plan.py): a step runs no `Module.__call__` of the
    projections, embedding or LM head (a forward pre-hook on each would fire), and its logits equal the unfused
    model's."""
    model = _model("qwen3", torch.float32, fused_layers=True)
    calls = []
    for name, module in model.named_modules():
        if name.endswith(("_proj", "embed_tokens", "lm_head")):
            module.register_forward_pre_hook(lambda m, args, name=name: calls.append(name))
    got = _step_logits(model, _lm_logits)
    assert calls == []
    for got_step, expected in zip(got, _step_logits(_model("qwen3", torch.float32, fused_layers=False))):
        torch.testing.assert_close(got_step, expected, rtol=1e-5, atol=1e-5)
