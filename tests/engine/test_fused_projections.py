"""q/k/v and gate/up fused into one GEMM each: the same logits, one copy of every weight, per architecture.

The engine's greedy tokens on the fused layers equal transformers' generate for every architecture in
tests/engine/test_matches_transformers.py (the runner fuses on CPU); these are the layer-level checks.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import transformers
from torch import nn

from pagedinfer.engine import LLM
from pagedinfer.engine.cpu.fused_projections import fuse_projections
from pagedinfer.engine.cpu.linear import PackedLinear, pack_linear_weights
from pagedinfer.engine.tiny_model import tiny_config

IDS = torch.tensor(
    [[5, 9, 11, 2, 40, 7, 63, 12, 90, 33, 7, 8, 300, 17, 250, 1, 77, 45, 2, 99, 101, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
)  # 30 tokens: past the tiny Mistral's sliding window of 24


def _model(arch: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch), dtype=dtype).eval()
    with torch.no_grad():  # decisive logits (engine/tiny_model.py's scale), so a wrong split shows
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_fused_and_packed_layers_give_the_unfused_logits_and_hold_one_copy(arch):
    model = _model(arch)
    with torch.inference_mode():
        want = model(input_ids=IDS).logits
    bytes_before = _param_bytes(model)
    attn = model.model.layers[0].self_attn
    originals = [weakref.ref(attn.q_proj.weight), weakref.ref(model.model.layers[0].mlp.up_proj.weight)]
    report = fuse_projections(model)
    pack_linear_weights(model)
    gc.collect()
    layers = [f"model.layers.{i}" for i in range(len(model.model.layers))]
    assert report.qkv == tuple(f"{n}.self_attn" for n in layers)
    assert report.gate_up == tuple(f"{n}.mlp" for n in layers)
    assert all(ref() is None for ref in originals), "an unfused weight is still held somewhere: two copies"
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    assert not names & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    assert isinstance(attn.qkv_proj, PackedLinear) and attn.qkv_proj.weight.is_mkldnn
    assert _param_bytes(model) == pytest.approx(bytes_before, rel=0.03)
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=IDS).logits, want, rtol=1e-5, atol=1e-5)


def test_fused_bf16_logits_equal_the_unfused_bf16_ones():
    """bf16 GEMMs accumulate in fp32 per output column: fusing the columns changes no rounding."""
    dense, fused = _model("qwen2", torch.bfloat16), _model("qwen2", torch.bfloat16)
    pack_linear_weights(dense)
    fuse_projections(fused)
    pack_linear_weights(fused)
    with torch.inference_mode():
        torch.testing.assert_close(fused(input_ids=IDS).logits, dense(input_ids=IDS).logits, rtol=1e-2, atol=1e-2)


def test_modules_that_cannot_be_fused_are_left_as_they_are():
    """Phi-3 fuses its own projections; a layer whose weights differ in dtype (or are no nn.Linear) is kept."""
    phi3 = _model("phi3")
    assert fuse_projections(phi3) == type(fuse_projections(phi3))((), ())
    llama = _model("llama")
    attn = llama.model.layers[1].self_attn
    attn.k_proj = PackedLinear(attn.k_proj)
    with torch.inference_mode():
        want = llama(input_ids=IDS).logits
    report = fuse_projections(llama)
    assert report.qkv == ("model.layers.0.self_attn",) and hasattr(attn, "q_proj")
    with torch.inference_mode():
        torch.testing.assert_close(llama(input_ids=IDS).logits, want, rtol=1e-5, atol=1e-5)


def test_the_engine_fuses_on_cpu_and_sizes_every_weight_once(tiny_llama):
    runner = LLM(model=str(tiny_llama), dtype="float32", device="cpu").llm_engine.runner
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
    assert len(runner.fusion.qkv) == len(runner.fusion.gate_up) == runner.num_layers
    assert runner.weight_bytes == pytest.approx(
        _param_bytes(plain) + sum(b.numel() * b.element_size() for b in plain.buffers()), rel=0.03
    )
    assert runner.model_shape().num_parameters == sum(p.numel() for p in plain.parameters())
