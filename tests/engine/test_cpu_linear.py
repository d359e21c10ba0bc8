"""CPU linear layers packed once for oneDNN: same results as F.linear, one copy of each weight."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch
import transformers
from torch import nn

from pagedinfer.engine import LLM
from pagedinfer.engine.cpu import linear as cpu_linear
from pagedinfer.engine.cpu.linear import PackedLinear, pack_linear_weights

ODD_SHAPES = [(1, 3, 5), (7, 33, 65), (17, 96, 1000), (130, 257, 31)]  # (tokens, in, out)


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,in_features,out_features", ODD_SHAPES)
def test_packed_linear_equals_f_linear_on_odd_shapes(dtype, tokens, in_features, out_features):
    torch.manual_seed(0)
    dense = nn.Linear(in_features, out_features, bias=out_features % 2 == 1, dtype=dtype)
    x = torch.randn(1, tokens, in_features, dtype=dtype)
    want = dense(x)
    packed = PackedLinear(dense)
    assert packed.weight.is_mkldnn and tuple(packed.weight.shape) == (out_features, in_features)
    got = packed(x)
    assert got.dtype == dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # both accumulate in fp32, then round once to bf16: at most a rounding step apart
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)
    # a non-contiguous input (a transposed view) gives the same rows
    xt = x[0].t().contiguous().t()
    torch.testing.assert_close(packed(xt), got[0], rtol=0, atol=0)


def _tiny(tied: bool) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # decisive logits, as engine/tiny_model.py's (argmax not decided by float noise)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_every_linear_is_packed_in_place_and_the_dense_weights_are_freed(tied):
    model = _tiny(tied)
    ids = torch.tensor([[5, 9, 11, 2, 40, 7]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
    bytes_before = _param_bytes(model)
    dense_q = weakref.ref(model.model.layers[0].self_attn.q_proj.weight)
    report = pack_linear_weights(model)
    gc.collect()
    assert report.backend == "onednn"
    assert dense_q() is None, "the dense weight is still held somewhere: two copies"
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    packed = [n for n, m in model.named_modules() if isinstance(m, PackedLinear)]
    assert len(packed) == 2 * 7 + (0 if tied else 1)  # q k v o gate up down per layer, lm_head if untied
    assert linears == (["lm_head"] if tied else []) and report.packed == tuple(packed)
    assert report.skipped_shared == (("lm_head",) if tied else ())
    if tied:  # the head still shares the embedding's table: one copy
        assert model.lm_head.weight is model.model.embed_tokens.weight
    assert _param_bytes(model) == pytest.approx(bytes_before, rel=0.03)
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


def test_the_engine_packs_its_cpu_linears_and_counts_their_bytes_once(tiny_llama, monkeypatch):
    """The exactness tests (tests/engine/test_matches_transformers.py) run on these packed layers."""
    packed = LLM(model=str(tiny_llama), dtype="float32", device="cpu").llm_engine.runner
    monkeypatch.setenv(cpu_linear.ENV_VAR, "aten")
    dense = LLM(model=str(tiny_llama), dtype="float32", device="cpu").llm_engine.runner
    assert dense.linear_packing.backend == "aten" and not dense.linear_packing.packed
    assert packed.linear_packing.backend == "onednn"
    assert "lm_head" in packed.linear_packing.packed
    assert all(m.weight.is_mkldnn for m in packed.model.modules() if isinstance(m, PackedLinear))
    assert not any(type(m) is nn.Linear for m in packed.model.modules())
    assert packed.weight_bytes == pytest.approx(dense.weight_bytes, rel=0.03)


def test_an_unknown_backend_is_a_clear_error(tiny_llama, monkeypatch):
    monkeypatch.setenv(cpu_linear.ENV_VAR, "mkl")
    with pytest.raises(ValueError, match="PAGEDINFER_CPU_LINEAR='mkl': expected one of onednn, aten"):
        pack_linear_weights(_tiny(False))


def test_without_onednn_the_layers_stay_dense_with_one_warning(monkeypatch, caplog):
    """A torch build without mkldnn: F.linear, and the warning once per process."""
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(cpu_linear, "_unavailable_warned", False)
    with caplog.at_level(logging.WARNING, logger=cpu_linear.__name__):
        reports = [pack_linear_weights(_tiny(False)) for _ in range(2)]
    assert all(r.backend == "aten" and not r.packed for r in reports)
    assert [r.getMessage() for r in caplog.records].count(
        "this torch build has no oneDNN packed linear ops: CPU linear layers use F.linear"
    ) == 1


def test_bf16_packed_logits_stay_as_close_to_fp32_as_f_linear_bf16():
    """oneDNN's bf16 GEMM accumulates in fp32 like F.linear's: packing adds no error, greedy agrees with fp32."""
    reference = _tiny(False)
    ids = torch.tensor([[5, 9, 11, 2, 40, 7, 63, 12, 90, 33]])
    with torch.inference_mode():
        fp32 = reference(input_ids=ids).logits
        dense = _tiny(False).to(torch.bfloat16)
        dense_bf16 = dense(input_ids=ids).logits.float()
        packed = _tiny(False).to(torch.bfloat16)
        pack_linear_weights(packed)
        packed_bf16 = packed(input_ids=ids).logits.float()
    dense_error = (dense_bf16 - fp32).abs().max().item()
    packed_error = (packed_bf16 - fp32).abs().max().item()
    print(f"max |logit - fp32|: F.linear bf16 {dense_error:.4f}, packed bf16 {packed_error:.4f}")
    assert packed_error <= 2 * dense_error + 1e-3
    assert (packed_bf16.argmax(-1) == fp32.argmax(-1)).float().mean() >= 0.9
