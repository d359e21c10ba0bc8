"""Every request the engine accepts finishes: no queue stalls, no seat or block over-commit.

Each case once hung or crashed: a prefill swapped out mid-prompt never came back,
swap-in reserved one block where a chunk needs several, the admission watermark
kept a request that fits the pool out forever, and forks of a running request
were not counted against max_num_seqs.
"""

from __future__ import annotations

import random

import pytest

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine import LLMEngine, SamplingParams


def engine(model, **kw):
    return LLMEngine(EngineConfig(model=str(model), dtype="float32", device="cpu", **kw))


def run(eng, max_steps=600):
    """Step to completion; returns {request_id: output} and the peak number of running sequences."""
    finished, peak = {}, 0
    for _ in range(max_steps):
        if not eng.has_unfinished_requests():
            eng.kv.check_invariants()
            stats = eng.get_stats()
            assert stats.num_used_blocks == 0 and eng.kv.stats().num_free_cpu_blocks == eng.num_cpu_blocks
            return finished, peak
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
        peak = max(peak, len(eng.scheduler.running))
    raise AssertionError(f"unfinished after {max_steps} steps: {eng.get_stats()}")


def prompt(length, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(8, 300) for _ in range(length)]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_prefill_preempted_mid_prompt_comes_back_in_chunks(tiny_llama, mode):
    eng = engine(
        tiny_llama,
        num_gpu_blocks_override=34,
        block_size=16,
        max_model_len=512,
        max_num_batched_tokens=32,
        preemption_mode=mode,
        swap_space=0.01,
    )
    eng.add_request("A", prompt(200, 1), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    eng.add_request("B", prompt(500, 2), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    finished, _ = run(eng)
    assert sorted(finished) == ["A", "B"]
    assert eng.scheduler.counters.num_preemptions[mode] > 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_fork_swapped_out_with_the_whole_pool_comes_back(tiny_llama, mode):
    eng = engine(
        tiny_llama,
        num_gpu_blocks_override=30,
        block_size=16,
        max_model_len=480,
        max_num_batched_tokens=512,
        preemption_mode=mode,
        swap_space=0.01,
    )
    eng.add_request("r", prompt(465), SamplingParams(n=2, temperature=0, max_tokens=15, ignore_eos=True))
    finished, _ = run(eng)
    assert [len(o.token_ids) for o in finished["r"].outputs] == [15, 15]


@pytest.mark.parametrize("chunked", [True, False])
def test_a_request_that_fits_the_pool_is_admitted_despite_the_watermark(tiny_llama, chunked):
    eng = engine(
        tiny_llama,
        num_gpu_blocks_override=100,
        block_size=8,
        max_model_len=800,
        max_num_batched_tokens=256 if chunked else 800,
        enable_chunked_prefill=chunked,
        watermark=0.01,
    )
    assert eng.kv.watermark_blocks == 1
    for attempt in ("cold", "prefix hit"):
        eng.add_request(attempt, prompt(795), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        finished, _ = run(eng)
        assert len(finished[attempt].outputs[0].token_ids) == 5


def test_forks_still_to_come_count_against_max_num_seqs(tiny_llama):
    eng = engine(
        tiny_llama,
        block_size=16,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        num_gpu_blocks_override=64,
    )
    eng.add_request("A", list(range(10, 110)), SamplingParams(n=3, temperature=0.7, max_tokens=5, ignore_eos=True))
    eng.add_request("B", [20, 21, 22], SamplingParams(max_tokens=5, ignore_eos=True))
    eng.add_request("C", [30, 31, 32], SamplingParams(max_tokens=5, ignore_eos=True))
    finished, peak = run(eng)
    assert sorted(finished) == ["A", "B", "C"] and peak <= 4


def test_a_stop_token_outside_the_vocabulary_is_refused_up_front(tiny_llama):
    eng = engine(tiny_llama, block_size=16, max_model_len=64, num_gpu_blocks_override=8)
    with pytest.raises(ValueError, match="stop_token_ids"):
        eng.add_request("r", [5, 6, 7], SamplingParams(stop_token_ids=[100000], min_tokens=2, max_tokens=4))
    assert not eng.has_unfinished_requests()


def test_a_stalled_scheduler_raises_instead_of_spinning(tiny_llama):
    eng = engine(tiny_llama, block_size=16, max_model_len=64, num_gpu_blocks_override=8)
    eng.add_request("r", [5, 6, 7], SamplingParams(max_tokens=4))
    eng.kv.pool.allocate(eng.kv.pool.num_free_blocks)  # blocks held outside the scheduler's view
    with pytest.raises(RuntimeError, match="scheduler stalled: 1 waiting"):
        eng.step()
