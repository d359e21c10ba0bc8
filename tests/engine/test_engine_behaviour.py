"""The engine end to end on a tiny Llama: prefix caching, sampling, n > 1, stops, bad input."""

from __future__ import annotations

import pytest

from pagedinfer.engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(
        model=str(tiny_llama),
        block_size=16,
        max_model_len=256,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=256,
        dtype="float32",
    )


def assert_pool_free(llm):
    stats = llm.get_stats()
    assert stats.num_used_blocks == 0 and stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_running_reqs == stats.num_waiting_reqs == stats.num_swapped_reqs == stats.num_waiting_seqs == 0
    llm.llm_engine.kv.check_invariants()


def test_shared_three_block_prefix_is_served_from_the_cache(llm):
    engine = llm.llm_engine
    prefix = list(range(10, 58))  # 48 tokens = 3 blocks of 16
    first = llm.generate([prefix + [5, 6, 7]], SamplingParams(temperature=0, max_tokens=2))[0]
    assert first.num_cached_tokens == 0
    computed_before = engine.num_prompt_tokens
    second = llm.generate([prefix + [8, 9, 10, 11, 12]], SamplingParams(temperature=0, max_tokens=2))[0]
    assert second.num_cached_tokens == 48
    assert engine.num_prompt_tokens - computed_before == 5  # only the rest was computed
    assert_pool_free(llm)


def test_prefix_hit_output_equals_cold_output(llm, tiny_llama):
    prompt = list(range(20, 90))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    warm = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params)[0]
    assert again.num_cached_tokens == 64
    cold = LLM(
        model=str(tiny_llama),
        enable_prefix_caching=False,
        max_model_len=256,
        num_gpu_blocks_override=32,
        dtype="float32",
    ).generate([prompt], params)[0]
    assert again.outputs[0].token_ids == warm.outputs[0].token_ids == cold.outputs[0].token_ids


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["hello world"], params)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=12)
    batched = llm.generate(["other", "hello world", "more text"], [others, params, others])[1]
    assert batched.outputs[0].token_ids == alone
    different = llm.generate(["hello world"], SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True))[
        0
    ]
    assert different.outputs[0].token_ids != alone
    assert_pool_free(llm)


def test_parallel_sampling_shares_the_prompt_blocks(llm):
    engine = llm.llm_engine
    n, prompt, max_tokens = 4, list(range(100, 140)), 4  # 40 tokens: 3 blocks, the last one partial
    engine.add_request(
        "par", prompt, SamplingParams(n=n, temperature=1.0, seed=7, max_tokens=max_tokens, ignore_eos=True)
    )
    peak = 0
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out
        peak = max(peak, engine.get_stats().num_used_blocks)
    unshared = n * -(-(len(prompt) + max_tokens) // 16)
    assert peak < unshared
    assert len(final.outputs) == n and all(len(o.token_ids) == max_tokens for o in final.outputs)
    assert len({tuple(o.token_ids) for o in final.outputs}) > 1
    assert_pool_free(llm)


def test_stop_strings_stop_tokens_min_tokens_and_logprobs(llm):
    probe = llm.generate(["The quick"], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    text = probe.outputs[0].text
    ids = probe.outputs[0].token_ids
    stop = text[3:6]
    out = llm.generate(["The quick"], SamplingParams(temperature=0, max_tokens=10, stop=stop))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop and out.text == text[: text.find(stop)]
    out = llm.generate(["The quick"], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[ids[2]]))[0]
    assert out.outputs[0].token_ids == ids[:3] and out.outputs[0].stop_reason == ids[2]
    out = llm.generate(
        ["The quick"], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[ids[0]], min_tokens=3)
    )[0].outputs[0]
    assert len(out.token_ids) >= 3 and out.token_ids[0] != ids[0]
    out = llm.generate(["The quick"], SamplingParams(temperature=0, max_tokens=3, logprobs=2))[0].outputs[0]
    assert len(out.logprobs) == 3
    for token, lp in zip(out.token_ids, out.logprobs):
        assert lp[token].rank == 1 and lp[token].logprob <= 0 and len(lp) == 2
    assert_pool_free(llm)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(n=0), "n"),
        (dict(stop=[""]), "stop"),
    ],
)
def test_bad_sampling_params_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_bad_prompts_raise_and_leak_nothing(llm):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([""], SamplingParams())
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([list(range(300))], SamplingParams())
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate(["ok", list(range(200))], SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([[10**9]], SamplingParams())
    assert not llm.llm_engine.has_unfinished_requests()
    assert_pool_free(llm)


def test_bad_engine_config_names_the_parameter(tiny_llama):
    with pytest.raises(ValueError, match="block_size"):
        LLM(model=str(tiny_llama), block_size=12)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(model=str(tiny_llama), gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="No room for the KV cache"):
        LLM(model=str(tiny_llama), num_gpu_blocks_override=2, max_model_len=256)
    with pytest.raises(ValueError, match="model"):
        LLM(model="/nonexistent/model")


def test_abort_frees_blocks_at_once(llm):
    engine = llm.llm_engine
    engine.add_request("a", list(range(10, 60)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.get_stats().num_used_blocks > 0
    engine.abort_request("a")
    assert not engine.has_unfinished_requests()
    assert_pool_free(llm)


def test_streamed_text_never_shows_the_start_of_a_stop_string(llm):
    engine = llm.llm_engine
    probe = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    full = probe.outputs[0].text
    assert len(full) >= 6
    stop = full[3:6] + "\x00never"  # its first characters appear, the whole never does
    engine.add_request(
        "hold", "Hello", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop, full[4:6]])
    )
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen.append(out.outputs[0].text)
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:])), "visible text must only grow"
    assert seen[-1] == full[: full.find(full[4:6])]  # cut at the second stop; the first's prefix never leaked
    assert_pool_free(llm)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_only_swap_preemption_reserves_a_host_pool(tiny_llama, mode):
    llm = LLM(
        model=str(tiny_llama),
        block_size=16,
        max_model_len=64,
        num_gpu_blocks_override=8,
        dtype="float32",
        preemption_mode=mode,
        swap_space=0.01,
    )
    engine = llm.llm_engine
    if mode == "swap":
        assert engine.num_cpu_blocks == int(0.01 * 2**30) // engine.bytes_per_block > 0
        assert engine.runner.cpu_cache.shape[2] == engine.num_cpu_blocks
    else:
        assert engine.num_cpu_blocks == 0 and engine.runner.cpu_cache is None


def test_a_stop_tokens_text_is_output_only_with_include_stop_str_in_output(llm):
    prompt = [5, 17, 33, 8, 90]
    free = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))[0].outputs[0]
    first, second = free.token_ids
    if first == second:
        pytest.skip("the random model repeats its first token")
    one = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))[0].outputs[0]
    for include, text in [(False, one.text), (True, free.text)]:
        for skip in (True, False):
            out = llm.generate(
                [prompt],
                SamplingParams(
                    temperature=0.0,
                    max_tokens=2,
                    stop_token_ids=[second],
                    include_stop_str_in_output=include,
                    skip_special_tokens=skip,
                ),
            )[0].outputs[0]
            assert (out.token_ids, out.finish_reason, out.stop_reason) == ([first, second], "stop", second)
            assert out.text == text, (include, skip)
    assert_pool_free(llm)


@pytest.mark.parametrize("spelling", [-1, 0])
def test_vllms_spellings_of_no_top_k_mean_none(spelling):
    assert SamplingParams(top_k=spelling).top_k is None
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
