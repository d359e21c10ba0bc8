"""prompt_logprobs: every prompt token's logprob given its prefix equals transformers' own forward.

Whatever computed the prompt: one packed step, chunked prefill across steps,
beside other requests, or a prompt whose blocks are already in the prefix
cache (those are recomputed, never skipped).
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from pagedinfer.engine import LLM, SamplingParams


def hf_prompt_logprobs(model_dir, prompt):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
    return torch.log_softmax(logits.float(), -1)


def prompts_of(vocab, lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(8, vocab) for _ in range(n)] for n in lengths]


def check(out, prompt, reference, k):
    got = out.prompt_logprobs
    assert len(got) == len(prompt) and got[0] is None
    for position in range(1, len(prompt)):
        entry = got[position]
        token = prompt[position]
        expected = reference[position - 1]
        assert entry[token].logprob == pytest.approx(float(expected[token]), abs=1e-4)
        assert entry[token].rank == int((expected > expected[token]).sum()) + 1
        top = torch.topk(expected, k).indices.tolist()
        assert set(top) <= set(entry)
        assert len(entry) <= k + 1


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {},  # one step computes every prompt
        {"max_num_batched_tokens": 16, "max_model_len": 128, "enable_chunked_prefill": True},  # chunks across steps
    ],
    ids=["one-step", "chunked"],
)
def test_prompt_logprobs_equal_transformers(tiny_llama, engine_kwargs):
    vocab = transformers.AutoConfig.from_pretrained(str(tiny_llama)).vocab_size
    prompts = prompts_of(vocab, (1, 2, 17, 40))
    llm = LLM(model=str(tiny_llama), dtype="float32", **engine_kwargs)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3))
    for out, prompt in zip(outs, prompts):
        check(out, prompt, hf_prompt_logprobs(tiny_llama, prompt), 3)


def test_prompt_blocks_in_the_prefix_cache_are_recomputed_for_prompt_logprobs(tiny_llama):
    vocab = transformers.AutoConfig.from_pretrained(str(tiny_llama)).vocab_size
    prompt = prompts_of(vocab, (48,), seed=3)[0]
    llm = LLM(model=str(tiny_llama), dtype="float32", enable_prefix_caching=True)
    first = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))[0]
    assert first.prompt_logprobs is None
    cached = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))[0]
    assert cached.num_cached_tokens > 0  # the prompt's blocks are in the cache
    scored = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))[0]
    assert scored.num_cached_tokens == 0
    check(scored, prompt, hf_prompt_logprobs(tiny_llama, prompt), 0)
    assert llm.get_stats().num_used_blocks == 0
