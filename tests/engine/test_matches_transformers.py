"""Greedy output equals transformers' own generate, token for token."""

from __future__ import annotations

import pytest
import transformers
from greedy_reference import hf_greedy, mixed_prompts

from pagedinfer.engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def expected(make_model):
    cache = {}

    def get(arch, max_new_tokens=12):
        key = (arch, max_new_tokens)
        if key not in cache:
            d = make_model(arch)
            vocab = transformers.AutoConfig.from_pretrained(str(d)).vocab_size
            prompts = mixed_prompts(vocab)
            cache[key] = (d, prompts, hf_greedy(d, prompts, max_new_tokens))
        return cache[key]

    return get


def run_engine(model_dir, prompts, max_tokens, **kwargs):
    """Greedy token ids of every prompt; with prefix caching, a second pass must hit and agree."""
    llm = LLM(model=str(model_dir), dtype="float32", **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, params)
    got = [o.outputs[0].token_ids for o in outs]
    if kwargs.get("enable_prefix_caching", True):
        again = llm.generate(prompts, params)
        assert sum(o.num_cached_tokens for o in again) > 0, "the second pass should hit the prefix cache"
        assert [o.outputs[0].token_ids for o in again] == got, "a prefix-cache hit changed the output"
    stats = llm.get_stats()
    assert stats.num_used_blocks == 0, "blocks leaked after every request finished"
    return got, stats


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "qwen3", "phi3"])
def test_greedy_equals_generate_per_architecture(expected, arch):
    model_dir, prompts, want = expected(arch)
    got, _ = run_engine(model_dir, prompts, 12, block_size=16)
    assert got == want


@pytest.mark.parametrize("block_size", [8, 32])
@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("chunked", [True, False])
def test_greedy_equals_generate_across_engine_settings(expected, block_size, prefix_caching, chunked):
    model_dir, prompts, want = expected("llama")
    got, _ = run_engine(
        model_dir,
        prompts,
        12,
        block_size=block_size,
        enable_prefix_caching=prefix_caching,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=32 if chunked else 1024,
        max_model_len=1024,
    )
    assert got == want


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_equals_generate_under_forced_preemption(expected, mode):
    model_dir, prompts, want = expected("llama")
    # 12 blocks of 8 tokens: one 87-token sequence fits, six do not -> preemption.
    llm_out, stats = run_engine(
        model_dir,
        prompts,
        12,
        block_size=8,
        num_gpu_blocks_override=12,
        max_model_len=96,
        preemption_mode=mode,
        swap_space=0.01,
    )
    assert llm_out == want
    assert stats.num_preemptions[mode] > 0


def test_a_vocabulary_wider_than_the_tokenizer_still_equals_generate(make_model):
    """The benchmark's 125M model has vocab 32000 over the 384-token tokenizer: ids past it are generated
    (they decode to nothing) and equal transformers'."""
    model_dir = make_model("llama", vocab_size=1000)
    assert transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size == 1000
    prompts = mixed_prompts(1000, lengths=(5, 17, 40))
    want = hf_greedy(model_dir, prompts, 8)
    assert max(max(ids) for ids in want) >= 384
    got, _ = run_engine(model_dir, prompts, 8, block_size=16, enable_prefix_caching=False)
    assert got == want


def test_a_vocabulary_narrower_than_the_tokenizer_is_refused(tmp_path):
    from pagedinfer.engine.tiny_model import make_tiny_model

    with pytest.raises(ValueError, match="vocab_size: must be >= the tokenizer's 384"):
        make_tiny_model(tmp_path, vocab_size=100)
