"""Beam search in the engine: shared blocks, one packed step with other requests, preemption, bad input."""

from __future__ import annotations

import random

import pytest

from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.beam.params import BeamSearchParams


def prompt_of(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, 384) for _ in range(n)]


def tokens(outs):
    return [[(s.tokens, s.finish_reason) for s in out.sequences] for out in outs]


def test_four_beams_hold_under_one_and_a_half_times_one_sequences_blocks(tiny_llama):
    prompt = prompt_of(200)
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=16, max_model_len=512, enable_prefix_caching=False)
    pool = llm.llm_engine.kv.pool
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    one_sequence = pool.peak_num_used_blocks
    assert one_sequence == -(-(200 + 64) // 16)
    pool.reset_peak()
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=4, max_tokens=64, ignore_eos=True))
    assert len(out.sequences) == 4 and all(len(s.tokens) == 264 for s in out.sequences)
    assert len({tuple(s.tokens) for s in out.sequences}) == 4
    assert pool.peak_num_used_blocks < 1.5 * one_sequence
    assert pool.num_used_blocks == 0
    llm.llm_engine.kv.check_invariants()


def test_beams_run_in_the_same_packed_step_as_ordinary_requests(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=8, max_model_len=256)
    engine = llm.llm_engine
    engine.add_request("beam", prompt_of(20, 1), BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True))
    engine.add_request("greedy", prompt_of(12, 2), SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    finished = {}
    num_steps = 0
    while engine.has_unfinished_requests():
        before = engine.num_generation_tokens
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
            elif out.request_id == "beam":
                pytest.fail("a beam search reports only its final output")
        num_steps += 1
        # every step gives the three beams (from the prefill's one row, three) and the greedy request a token
        assert engine.num_generation_tokens - before == 3 + 1
    assert num_steps == 8  # one step per token, both requests in every step
    assert [c.index for c in finished["beam"].outputs] == [0, 1, 2]
    alone = LLM(model=str(tiny_llama), dtype="float32", block_size=8, max_model_len=256).beam_search(
        [prompt_of(20, 1)], BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
    )
    assert [c.token_ids for c in finished["beam"].outputs] == [s.tokens[20:] for s in alone[0].sequences]
    assert engine.get_stats().num_used_blocks == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_beam_groups_under_a_tiny_pool_equal_the_unpreempted_result(tiny_llama, mode):
    prompts = [prompt_of(n, seed) for seed, n in enumerate((30, 21, 26))]
    params = BeamSearchParams(beam_width=4, max_tokens=24, ignore_eos=True)
    want = tokens(LLM(model=str(tiny_llama), dtype="float32", block_size=8).beam_search(prompts, params))
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        block_size=8,
        max_model_len=96,
        num_gpu_blocks_override=24,
        preemption_mode=mode,
        swap_space=0.01,
    )
    got = tokens(llm.beam_search(prompts, params))
    stats = llm.get_stats()
    assert stats.num_preemptions[mode] > 0
    assert got == want
    assert stats.num_used_blocks == 0
    llm.llm_engine.kv.check_invariants()


def test_a_second_beam_search_hits_the_prefix_cache_and_agrees(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=8, max_model_len=256)
    prompt = prompt_of(40, 3)
    params = BeamSearchParams(beam_width=2, max_tokens=24, ignore_eos=True)
    first = llm.beam_search([prompt], params)
    query, hit = llm.get_stats().prefix_cache_query_tokens, llm.get_stats().prefix_cache_hit_tokens
    # a beam's generated blocks were cached under their hashes: its full text is a cache hit now
    best = first[0].sequences[0].tokens
    out = llm.generate([best], SamplingParams(temperature=0.0, max_tokens=1))
    assert out[0].num_cached_tokens == (len(best) - 1) // 8 * 8
    again = llm.beam_search([prompt], params)
    assert llm.get_stats().prefix_cache_hit_tokens > hit and query
    assert tokens(again) == tokens(first)


@pytest.mark.parametrize(
    "params, name",
    [
        (dict(beam_width=5, max_tokens=4), "beam_width"),  # above max_num_seqs=4
        (dict(beam_width=4, max_tokens=200), "max_tokens"),  # prompt + max_tokens over max_model_len
        (dict(beam_width=4, max_tokens=100), "beam_width"),  # four diverging beams cannot fit the pool
    ],
)
def test_beam_searches_that_cannot_run_name_the_parameter(tiny_llama, params, name):
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        block_size=8,
        max_model_len=128,
        max_num_seqs=4,
        num_gpu_blocks_override=40,
    )
    with pytest.raises(ValueError, match=name):
        llm.beam_search([prompt_of(10)], BeamSearchParams(**params))
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.get_stats().num_used_blocks == 0


def test_beam_search_takes_only_beam_search_params(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", max_model_len=128)
    with pytest.raises(ValueError, match="params"):
        llm.beam_search(["hello"], SamplingParams(n=2))


def test_aborting_a_beam_search_frees_every_beam_at_once(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=8, max_model_len=256)
    engine = llm.llm_engine
    engine.add_request("beam", prompt_of(30, 4), BeamSearchParams(beam_width=4, max_tokens=40, ignore_eos=True))
    for _ in range(5):
        engine.step()
    assert len(engine.requests["beam"].group.seqs) == 4 and engine.get_stats().num_used_blocks > 0
    engine.abort_request("beam")
    assert not engine.has_unfinished_requests() and engine.get_stats().num_used_blocks == 0
    engine.kv.check_invariants()
