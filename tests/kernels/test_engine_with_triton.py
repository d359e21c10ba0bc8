"""The engine with PAGEDINFER_ATTENTION=triton (kernels on the CPU interpreter) equals transformers' generate.

Every attention, KV write and block swap of the engine's steps runs through
the Triton kernels: mixed decode + chunked-prefill steps, prefix-cache hits
(two prompts share a prefix), a sliding window crossed (Mistral's tiny model
has a window of 24), and swap preemption.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.kernels import dispatch

MAX_NEW_TOKENS = 6


def prompts_with_shared_prefix(vocab_size: int) -> list[list[int]]:
    rng = random.Random(7)
    prefix = [rng.randrange(8, vocab_size) for _ in range(20)]
    return [prefix + [rng.randrange(8, vocab_size) for _ in range(n)] for n in (3, 9)] + [[5], [9, 11, 13]]


def transformers_greedy(model_dir, prompts):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    outputs = []
    with torch.no_grad():
        for ids in prompts:
            generated = model.generate(
                torch.tensor([ids]),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                min_new_tokens=MAX_NEW_TOKENS,
                pad_token_id=0,
            )
            outputs.append(generated[0, len(ids) :].tolist())
    return outputs


def engine_greedy(model_dir, prompts, **engine_kwargs):
    llm = LLM(model=str(model_dir), dtype="float32", **engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert llm.get_stats().num_used_blocks == 0
    return [o.outputs[0].token_ids for o in outputs], llm.get_stats()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_engine_on_triton_kernels_equals_generate(make_model, monkeypatch, arch):
    model_dir = make_model(arch)
    prompts = prompts_with_shared_prefix(transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size)
    expected = transformers_greedy(model_dir, prompts)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    got, stats = engine_greedy(model_dir, prompts, block_size=8, max_num_batched_tokens=16, max_model_len=64)
    assert got == expected
    assert stats.prefix_cache_hit_tokens > 0


@pytest.mark.slow
def test_engine_on_triton_kernels_survives_swap_preemption(make_model, monkeypatch):
    model_dir = make_model("llama")
    prompts = prompts_with_shared_prefix(transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size)
    expected = transformers_greedy(model_dir, prompts)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    got, stats = engine_greedy(
        model_dir,
        prompts,
        block_size=8,
        num_gpu_blocks_override=6,
        max_model_len=40,
        preemption_mode="swap",
        swap_space=0.01,
        enable_prefix_caching=False,
    )
    assert got == expected
    assert stats.num_preemptions["swap"] > 0


@pytest.mark.slow
def test_beam_search_on_triton_kernels_equals_the_torch_references(make_model, monkeypatch):
    """Beams fork and copy their shared last block (copy_blocks) and swap out and in as a group."""
    from pagedinfer.engine.beam.params import BeamSearchParams

    model_dir = make_model("llama")
    prompts = prompts_with_shared_prefix(transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size)[:2]
    params = BeamSearchParams(beam_width=3, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    engine_kwargs = dict(
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=10,
        max_model_len=40,
        preemption_mode="swap",
        swap_space=0.01,
        enable_prefix_caching=False,
    )

    def beams():
        llm = LLM(model=str(model_dir), **engine_kwargs)
        outs = llm.beam_search(prompts, params)
        assert llm.get_stats().num_used_blocks == 0
        return [[s.tokens for s in out.sequences] for out in outs], llm.get_stats()

    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    want, _ = beams()
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    got, stats = beams()
    assert got == want
    assert stats.num_preemptions["swap"] > 0
