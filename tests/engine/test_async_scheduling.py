"""`EngineConfig.async_scheduling`: step N+1 scheduled and step N-1's outputs made while step N's forward runs on
the forward thread (engine/async_step/), with exactly the outputs of the synchronous engine."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import transformers
from engine_checks import POOL_SETTINGS, assert_pool_free, generate_twice, greedy_text  # noqa: F401 - a fixture
from greedy_reference import hf_greedy, mixed_prompts

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.llm_engine import LLMEngine
from pagedinfer.engine.structured.params import StructuredOutputsParams

BOUNDED_WAIT_SECONDS = 60.0  # a bounded wait of the instrumentation, never a timing assertion


def run_deltas(engine: LLMEngine, stages: list[list], steps_between: int = 3) -> dict[str, list]:
    """Every request's deltas (timings left out); each stage's requests are added `steps_between` steps after the
    previous stage's."""
    deltas: dict[str, list] = {rid: [] for stage in stages for rid, _, _ in stage}
    for number, stage in enumerate(stages):
        for request_id, prompt, params in stage:
            engine.add_request(request_id, prompt, params)
        steps = 0
        while engine.has_unfinished_requests() and (number == len(stages) - 1 or steps < steps_between):
            steps += 1
            for delta in engine.step_deltas():
                deltas[delta.request_id].append(dataclasses.replace(delta, metrics=None))
    return deltas


@pytest.mark.parametrize("overlap", ["off", "thread"])
def test_every_delta_is_the_same_with_async_scheduling_on_and_off(tiny_llama, greedy_text, overlap):  # noqa: F811 (the fixture)
    """Stop strings ending mid-output, stop tokens, seeded sampling with penalties, min_tokens and logprobs,
    lengths ending at different steps; then, mid-flight, requests that keep the engine synchronous (n > 1,
    prompt logprobs, beam search, structured outputs) and after them plain ones again: the same deltas."""
    text = greedy_text
    greedy = dict(temperature=0, ignore_eos=True)
    first = [
        ("stop", "Hello", SamplingParams(max_tokens=16, stop=[text[5:8]], **greedy)),
        (
            "stop-incl",
            "Hello",
            SamplingParams(max_tokens=16, stop=[text[5:8]], include_stop_str_in_output=True, logprobs=1, **greedy),
        ),
        ("hold", "Hello", SamplingParams(max_tokens=16, stop=[text[3:6] + "\x00never", text[7:9]], **greedy)),
        ("stop-token", "the quick brown fox", SamplingParams(temperature=0, max_tokens=9, stop_token_ids=[7, 9])),
        (
            "seeded",
            "jumps over",
            SamplingParams(
                temperature=0.9,
                top_p=0.9,
                seed=5,
                max_tokens=11,
                ignore_eos=True,
                repetition_penalty=1.3,
                frequency_penalty=0.5,
                min_tokens=4,
                logprobs=2,
            ),
        ),
        ("short", list(range(40, 77)), SamplingParams(max_tokens=1, **greedy)),
        ("long", list(range(100, 140)), SamplingParams(max_tokens=30, **greedy)),
    ]
    synchronous = [
        ("n2", "a lazy dog", SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True)),
        ("prompt-lp", list(range(30, 70)), SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=3)),
        ("beam", "hello there", BeamSearchParams(beam_width=2, max_tokens=4)),
        (
            "choice",
            "Pick: ",
            SamplingParams(
                temperature=1.0,
                seed=2,
                max_tokens=10,
                structured_outputs=StructuredOutputsParams(choice=["one", "two"]),
            ),
        ),
    ]
    last = [("after", "over the", SamplingParams(max_tokens=6, **greedy))]
    config = EngineConfig(
        model=str(tiny_llama),
        dtype="float32",
        block_size=8,
        max_model_len=128,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=24,
        seed=11,
        overlap=overlap,
    )
    off, on = LLMEngine(config), LLMEngine(dataclasses.replace(config, async_scheduling=True))
    try:
        want, got = run_deltas(off, [first, synchronous, last]), run_deltas(on, [first, synchronous, last])
        assert got == want
        assert "".join(d.outputs[0].new_text for d in want["stop"]) == text[:5]  # nothing past the stop
        assert want["stop"][-1].outputs[0].finish_reason == "stop" and len(want["hold"]) > 3
        assert want["long"][-1].outputs[0].finish_reason == "length"
        assert "".join(d.outputs[0].new_text for d in want["choice"]) in ("one", "two")
        for engine in (off, on):
            assert_pool_free(engine)
        assert on._async.thread.num_jobs > 10 and on._async.can_run_ahead()  # it ran ahead, and runs ahead again
    finally:
        off.shutdown()
        on.shutdown()


@pytest.fixture(scope="module")
def reference(make_model):
    model_dir = make_model("llama")
    prompts = mixed_prompts(transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size)
    lengths = [3, 12, 7, 1, 12, 9, 5]  # each request ends at its own step
    full = hf_greedy(model_dir, prompts, 12)
    return model_dir, prompts, lengths, [out[:n] for out, n in zip(full, lengths)], full


@POOL_SETTINGS
def test_greedy_with_async_scheduling_equals_transformers_and_leaks_no_block(reference, settings):
    model_dir, prompts, lengths, want, _ = reference
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    llm = LLM(model=str(model_dir), dtype="float32", async_scheduling=True, **settings)
    try:
        again = generate_twice(llm, prompts, params, want)
        assert llm.llm_engine._async.thread.num_jobs >= 2 * max(lengths)
        if "preemption_mode" in settings:
            assert llm.get_stats().num_preemptions[settings["preemption_mode"]] > 0
            return
        assert sum(o.num_cached_tokens for o in again) > 0
        # the blocks of generated tokens are cached under their real ids (never a placeholder's): a prompt that
        # continues an output hits them exactly as on the synchronous engine
        continued = [prompt + out for prompt, out in zip(prompts, want)]
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        synchronous = LLM(model=str(model_dir), dtype="float32", **settings)
        synchronous.generate(prompts, params)
        hits = [o.num_cached_tokens for o in synchronous.generate(continued, one)]
        assert [o.num_cached_tokens for o in llm.generate(continued, one)] == hits and sum(hits) > 0
    finally:
        llm.shutdown()


def test_decode_graph_buckets_take_the_placeholders_ids(reference):
    """Pure-decode steps replayed from the CUDA-graph buckets' static buffers (eagerly on a CPU) get their
    placeholders' ids written into the static input ids."""
    model_dir, prompts, lengths, want, _ = reference
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        async_scheduling=True,
        max_cudagraph_capture_size=8,
        block_size=8,
        max_model_len=96,
    )
    try:
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        generate_twice(llm, prompts, params, want)
        assert sum(llm.llm_engine.runner.decode_graphs.num_runs.values()) >= max(lengths)
    finally:
        llm.shutdown()


def test_an_abort_mid_flight_frees_its_blocks_and_changes_no_other_output(reference):
    model_dir, prompts, _, _, full = reference
    engine = LLMEngine(
        EngineConfig(model=str(model_dir), dtype="float32", block_size=8, max_model_len=96, async_scheduling=True)
    )
    try:
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        outputs: dict[str, list] = {}
        for _ in range(4):
            for out in engine.step():
                outputs[out.request_id] = out.outputs[0].token_ids
        assert engine._async.in_flight is not None  # the abort lands while a step of it runs
        engine.abort_request("1")
        while engine.has_unfinished_requests():
            for out in engine.step():
                assert out.request_id != "1"
                outputs[out.request_id] = out.outputs[0].token_ids
        assert {rid: ids for rid, ids in outputs.items() if rid != "1"} == {
            str(i): ids for i, ids in enumerate(full) if i != 1
        }
        assert_pool_free(engine)
    finally:
        engine.shutdown()


def test_the_next_step_is_scheduled_while_the_forward_runs_on_its_own_thread(tiny_llama):
    """Each forward (on the forward thread) is held until the engine thread has scheduled the step after it."""
    llm = LLM(
        model=str(tiny_llama), dtype="float32", max_model_len=256, num_gpu_blocks_override=32, async_scheduling=True
    )
    engine, engine_thread = llm.llm_engine, threading.get_ident()
    scheduled, forward_threads = threading.Event(), set()
    real_schedule, real_forward = engine.scheduler.schedule, engine.runner._forward

    def schedule():
        try:
            return real_schedule()
        finally:
            scheduled.set()

    def forward(*args):
        forward_threads.add(threading.get_ident())
        assert scheduled.wait(BOUNDED_WAIT_SECONDS), "the next step was not scheduled during this forward"
        scheduled.clear()
        return real_forward(*args)

    engine.scheduler.schedule, engine.runner._forward = schedule, forward
    try:
        scheduled.clear()
        outs = llm.generate(
            ["Hello", "the quick brown fox"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        )
        assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
        assert forward_threads == {engine._async.thread.ident} != {engine_thread}
    finally:
        llm.shutdown()


def test_async_scheduling_must_be_a_boolean(tiny_llama):
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(model=str(tiny_llama), async_scheduling="yes")
