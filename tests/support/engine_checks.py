"""Checks and fixtures shared by the engine tests that compare a mode against the plain engine
(overlap, async scheduling)."""

from __future__ import annotations

import pytest

from pagedinfer.engine import LLM, SamplingParams


def assert_pool_free(engine) -> None:
    """Every block free, no request left in any queue, the KV manager's invariants hold."""
    stats = engine.get_stats()
    assert stats.num_used_blocks == 0 and stats.num_free_blocks == stats.num_total_blocks, stats
    assert stats.num_running_reqs == stats.num_waiting_reqs == stats.num_swapped_reqs == 0
    engine.kv.check_invariants()


@pytest.fixture(scope="module")
def greedy_text(tiny_llama):
    """The greedy text of "Hello" (16 tokens), from which stop strings that end mid-output are cut."""
    llm = LLM(model=str(tiny_llama), dtype="float32", max_model_len=256, num_gpu_blocks_override=32)
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    assert len(out.text) >= 12
    return out.text


# what a mode is proven under: a tiny pool preempting by recompute, by swap; prefix caching with chunked prompts
POOL_SETTINGS = pytest.mark.parametrize(
    "settings",
    [
        dict(block_size=8, num_gpu_blocks_override=12, max_model_len=96, preemption_mode="recompute"),
        dict(block_size=8, num_gpu_blocks_override=12, max_model_len=96, preemption_mode="swap", swap_space=0.01),
        dict(block_size=16, enable_prefix_caching=True, max_num_batched_tokens=32, max_model_len=1024),
    ],
    ids=["recompute", "swap", "prefix-cache-chunked"],
)


def generate_twice(llm, prompts, params, want: list[list[int]]) -> list:
    """Generate twice (the second time with prefix-cache hits or recomputes), each time exactly `want`'s token ids,
    then check the pool is free; the second run's outputs."""
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    again = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in again] == want
    assert_pool_free(llm.llm_engine)
    return again
