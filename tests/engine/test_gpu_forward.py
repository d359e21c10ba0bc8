"""The engine on our own Triton decoder (`--forward triton`, kernels on the CPU interpreter) equals transformers'
`generate` in float32: several requests, decodes and chunked prefills in the same steps, a prefix-cache hit, the
decode-graph buckets' padding; Llama, Qwen3, Mistral and Qwen2."""

from __future__ import annotations

import pytest
import torch
import transformers
from greedy_reference import hf_greedy

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.kernels import dispatch

MAX_NEW_TOKENS = 4


def prompts(model_dir) -> list[list[int]]:
    vocab = transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size
    prefix = [(17 * i) % (vocab - 8) + 8 for i in range(11)]
    return [prefix + [9, 30], prefix + [40], [5], [12, 13, 14, 15, 16, 17, 18]]


def test_triton_decoder_equals_generate(make_model, monkeypatch):
    """Pure-decode steps run from the CUDA-graph buckets' static buffers (eagerly on a CPU): a 3-sequence step
    pads to bucket 4, whose padding row (slot -1) must write no K/V."""
    model_dir = make_model("llama")
    batch = prompts(model_dir)
    expected = hf_greedy(model_dir, batch, MAX_NEW_TOKENS)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")  # the attention too: the GPU's kernels end to end
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        forward="triton",
        block_size=8,
        max_num_batched_tokens=8,
        max_model_len=32,
        max_cudagraph_capture_size=4,
    )
    assert llm.llm_engine.runner.triton_decoder is not None and llm.llm_engine.runner.layer_fusion is None
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(batch, params)]
    assert got == expected
    stats = llm.get_stats()
    assert stats.prefix_cache_hit_tokens > 0 and stats.num_used_blocks == 0


@pytest.mark.parametrize("arch", ["qwen3", "mistral", "qwen2"])
def test_triton_decoder_runs_each_family_as_generate_does(make_model, monkeypatch, arch):
    """Qwen3's q/k norms, Mistral's window (24 in the tiny model, crossed by the 26-token prompt), Qwen2's q/k/v
    biases in the fused GEMM."""
    model_dir = make_model(arch)
    batch = [[(7 * i) % 370 + 8 for i in range(26)]]
    expected = hf_greedy(model_dir, batch, 3)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    llm = LLM(model=str(model_dir), dtype="float32", forward="triton", block_size=8, max_model_len=32)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(batch, params)] == expected


def test_forward_triton_refuses_a_model_it_cannot_run(make_model):
    with pytest.raises(ValueError, match="Triton decoder cannot run this model: model class Phi3ForCausalLM"):
        LLM(model=str(make_model("phi3")), dtype="float32", forward="triton")


def test_forward_auto_on_a_cpu_keeps_the_cpu_fused_layers(tiny_llama):
    runner = LLM(model=str(tiny_llama), dtype="float32", max_model_len=32).llm_engine.runner
    assert runner.triton_decoder is None and runner.layer_fusion.fused


def test_which_forward_runs_where():
    from pagedinfer.engine.gpu_forward.select import wants_triton_decoder

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert wants_triton_decoder("auto", cuda, 1) and wants_triton_decoder("triton", cpu, 1)
    assert not wants_triton_decoder("auto", cuda, 2) and not wants_triton_decoder("auto", cpu, 1)
    assert not wants_triton_decoder("module", cuda, 1)
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        wants_triton_decoder("triton", cuda, 2)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(forward="fused"), "forward .--forward.: must be one of"),
        (dict(forward="triton", compile=True), "choose one"),
    ],
)
def test_bad_forward_options_are_named(tiny_llama, kwargs, message):
    from pagedinfer.contracts.config.engine_config import EngineConfig

    with pytest.raises(ValueError, match=message):
        EngineConfig(model=str(tiny_llama), **kwargs)
