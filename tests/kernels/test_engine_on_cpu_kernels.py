"""The CPU engine runs the native kernels by default, and its greedy output equals transformers' generate."""

from __future__ import annotations

import pytest
import torch
import transformers
from greedy_reference import hf_greedy, mixed_prompts

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.kernels import dispatch

MAX_NEW_TOKENS = 8


@pytest.mark.slow
def test_default_cpu_engine_calls_the_native_ops_and_equals_generate(make_model, monkeypatch, native_cpu_kernels):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    model_dir = make_model("mistral")  # a sliding window the longest prompts cross
    prompts = mixed_prompts(transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size)
    llm = LLM(model=str(model_dir), dtype="float32", enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    ops_run = {event.key for event in profile.key_averages()}
    assert {"pagedinfer::cpu_paged_attention", "pagedinfer::cpu_write_kv"} <= ops_run
    assert got == hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
