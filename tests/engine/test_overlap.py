"""`EngineConfig.overlap`: outputs made on the output thread or in the output process while the next forward runs,
exactly as without it."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import pytest
import transformers
from engine_checks import POOL_SETTINGS, assert_pool_free, generate_twice, greedy_text  # noqa: F401 - a fixture
from greedy_reference import hf_greedy, mixed_prompts

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.llm_engine import LLMEngine
from pagedinfer.engine.overlap import side as output_side_module

BOUNDED_WAIT_SECONDS = 60.0  # a bounded wait of the instrumentation, never a timing assertion


MODES = ["thread", "process"]  # the overlap modes; each is proven against "off"


def engine_pair(model_dir, mode: str, **kwargs) -> tuple[LLMEngine, LLMEngine]:
    """(without overlap, with overlap `mode`), otherwise the same engine."""
    config = EngineConfig(model=str(model_dir), dtype="float32", **kwargs)
    return LLMEngine(config), LLMEngine(dataclasses.replace(config, overlap=mode))


def run_deltas(engine: LLMEngine, requests, steps_with_outputs: list | None = None) -> dict[str, list]:
    """Every request's deltas (timings left out), in the order the engine returned them; appends to
    steps_with_outputs the number of steps that returned any."""
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params)
    deltas: dict[str, list] = {request_id: [] for request_id, _, _ in requests}
    num_steps = 0
    while engine.has_unfinished_requests():
        step = engine.step_deltas()
        num_steps += bool(step)
        for delta in step:
            deltas[delta.request_id].append(dataclasses.replace(delta, metrics=None))
    if steps_with_outputs is not None:
        steps_with_outputs.append(num_steps)
    return deltas


def assert_worked_beside(engine: LLMEngine, num_batches: int) -> None:
    """The engine's output side processed num_batches batches, off the engine thread (or process)."""
    side = engine.output_side.worker
    assert side.num_batches == num_batches
    if engine.config.overlap == "process":
        assert side.pid != os.getpid() and side.num_child_requests == 0  # every request's state freed
        assert not side._reqs and not side._keys


def kv_counters(engine: LLMEngine) -> tuple:
    s = engine.get_stats()
    return (
        s.num_free_blocks,
        s.num_cached_free_blocks,
        s.prefix_cache_query_tokens,
        s.prefix_cache_hit_tokens,
        s.num_prompt_tokens,
        s.num_generation_tokens,
    )


@pytest.mark.parametrize("mode", MODES)
def test_every_delta_is_the_same_with_overlap_on_and_off(tiny_llama, greedy_text, mode):  # noqa: F811 (the fixture)
    """Stop strings ending mid-output (with and without their text, one held back), stop tokens, n > 1 with
    logprobs, prompt logprobs, beam search and chunked prefill: each request gets the same deltas."""
    text = greedy_text
    requests = [
        ("stop", "Hello", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[text[5:8]])),
        (
            "stop-incl",
            "Hello",
            SamplingParams(
                temperature=0,
                max_tokens=16,
                ignore_eos=True,
                stop=[text[5:8]],
                include_stop_str_in_output=True,
                logprobs=1,
            ),
        ),
        (
            "hold",
            "Hello",
            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[text[3:6] + "\x00never", text[7:9]]),
        ),
        (
            "n2",
            "jumps over",
            SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=7, ignore_eos=True, logprobs=0, stop=["e", "a "]),
        ),
        ("stop-token", "the quick brown fox", SamplingParams(temperature=0, max_tokens=9, stop_token_ids=[7, 9])),
        ("prompt-lp", list(range(30, 70)), SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=3)),
        ("beam", "hello there", BeamSearchParams(beam_width=2, max_tokens=4)),
    ]
    off, on = engine_pair(
        tiny_llama,
        mode,
        block_size=8,
        max_model_len=128,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=24,
        seed=11,
    )  # chunked prompts
    try:
        steps: list[int] = []
        want, got = run_deltas(off, requests, steps), run_deltas(on, requests)
        assert got == want
        assert want["stop"][-1].outputs[0].finish_reason == "stop"
        assert "".join(d.outputs[0].new_text for d in want["stop"]) == text[:5]  # nothing past the stop
        assert len(want["hold"]) > 3 and want["n2"][-1].finished
        for engine in (off, on):
            assert_pool_free(engine)
        assert kv_counters(on) == kv_counters(off)
        assert_worked_beside(on, steps[0])  # each step's outputs (one step later) were made on the output side
    finally:
        on.shutdown()


@pytest.fixture(scope="module")
def reference(make_model):
    model_dir = make_model("llama")
    prompts = mixed_prompts(transformers.AutoConfig.from_pretrained(str(model_dir)).vocab_size)
    return model_dir, prompts, hf_greedy(model_dir, prompts, 12)


@pytest.mark.parametrize("mode", MODES)
@POOL_SETTINGS
def test_greedy_with_overlap_equals_transformers_and_leaks_no_block(reference, settings, mode):
    model_dir, prompts, want = reference
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = LLM(model=str(model_dir), dtype="float32", overlap=mode, **settings)
    try:
        again = generate_twice(llm, prompts, params, want)
        assert llm.llm_engine.output_side.worker.num_batches >= 2 * 12
        if mode == "process":
            assert llm.llm_engine.output_side.worker.num_child_requests == 0
        if "preemption_mode" in settings:
            assert llm.get_stats().num_preemptions[settings["preemption_mode"]] > 0
        else:
            assert sum(o.num_cached_tokens for o in again) > 0
    finally:
        llm.shutdown()


def test_the_output_thread_detokenizes_while_the_next_forward_runs(tiny_llama, monkeypatch):
    """Each step's outputs are made off the engine thread, within the next step's forward; only the last
    step's (no forward follows it) are waited for."""
    llm = LLM(model=str(tiny_llama), dtype="float32", max_model_len=256, num_gpu_blocks_override=32, overlap="thread")
    engine, engine_thread = llm.llm_engine, threading.get_ident()
    output_thread = engine.output_side.worker
    go = threading.Event()  # a forward began or the engine waits for outputs: the output thread may proceed
    in_forward, processed = threading.Event(), threading.Event()
    calls: list[tuple[int, bool]] = []  # per batch: (its thread, whether a forward was running)
    real_process, real_execute, real_wait = output_side_module.process_batch, engine.runner.execute, output_thread.wait

    def process(batch, tokenizer):
        if threading.get_ident() != engine_thread:  # hold it until there is something to overlap with
            assert go.wait(BOUNDED_WAIT_SECONDS)
        calls.append((threading.get_ident(), in_forward.is_set()))
        try:
            return real_process(batch, tokenizer)
        finally:
            processed.set()

    def execute(*args, **kwargs):
        waiting_for_outputs = output_thread.in_flight
        in_forward.set()
        go.set()
        try:
            result = real_execute(*args, **kwargs)
            if waiting_for_outputs:  # the previous step's outputs are made before this forward "ends"
                assert processed.wait(BOUNDED_WAIT_SECONDS), "the output thread never processed the batch"
            return result
        finally:
            processed.clear()
            in_forward.clear()
            go.clear()

    def wait():
        go.set()
        try:
            return real_wait()
        finally:
            go.clear()

    monkeypatch.setattr(output_side_module, "process_batch", process)
    engine.runner.execute, output_thread.wait = execute, wait
    try:
        outs = llm.generate(
            ["Hello", "the quick brown fox"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        )
        assert all(len(o.outputs[0].token_ids) == 8 and o.outputs[0].text for o in outs)
        assert len(calls) == 8
        assert {thread for thread, _ in calls} == {output_thread.ident} != {engine_thread}
        assert [during_forward for _, during_forward in calls] == [True] * 7 + [False]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_an_abort_drops_the_outputs_still_on_the_output_side(tiny_llama, mode):
    """...and in process mode the child frees the aborted request's state (nothing grows)."""
    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama), dtype="float32", max_model_len=256, num_gpu_blocks_override=32, overlap=mode
        )
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        engine.add_request("kept", "Hello", params)
        engine.add_request("gone", "the quick brown fox", params)
        assert engine.step_deltas() == []  # the first step's outputs are still on the output thread
        assert engine.output_side.worker.in_flight
        engine.abort_request("gone")
        seen = []
        while engine.has_unfinished_requests():
            seen.extend(engine.step_deltas())
        assert {d.request_id for d in seen} == {"kept"}
        assert sum(len(d.outputs[0].new_token_ids) for d in seen) == 6
        assert_pool_free(engine)
        if mode == "process":  # "gone"'s state reached the child with its first token; the abort freed it
            assert engine.output_side.worker.num_child_requests == 0 and not engine.output_side.worker._reqs
    finally:
        engine.shutdown()


def test_a_failure_on_the_output_thread_fails_generate_and_the_thread_stops(tiny_llama, monkeypatch):
    llm = LLM(model=str(tiny_llama), dtype="float32", max_model_len=256, num_gpu_blocks_override=32, overlap="thread")
    engine = llm.llm_engine
    real_process = output_side_module.process_batch
    calls = []

    def faulty(batch, tokenizer):
        calls.append(threading.get_ident())
        if len(calls) == 3:
            raise KeyError("injected fault in output processing")
        return real_process(batch, tokenizer)

    monkeypatch.setattr(output_side_module, "process_batch", faulty)
    with pytest.raises(KeyError, match="injected fault"):
        llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert set(calls) == {engine.output_side.worker.ident}
    assert not engine.has_unfinished_requests()
    assert_pool_free(engine)
    llm.shutdown()
    assert not engine.output_side.worker._thread.is_alive()


def test_step_returns_the_same_cumulative_outputs_from_the_output_process(tiny_llama, greedy_text):  # noqa: F811 (the fixture)
    """step() (a RequestOutput, every token so far, per touched request) crosses back as well as deltas do."""
    off, on = engine_pair(tiny_llama, "process", max_model_len=128, num_gpu_blocks_override=32)
    try:
        outputs = []
        for engine in (off, on):
            engine.add_request(
                "stop",
                "Hello",
                SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[greedy_text[5:8]], logprobs=1),
            )
            engine.add_request(
                "n2",
                "jumps over",
                SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True, prompt_logprobs=1),
            )
            steps = []
            while engine.has_unfinished_requests():
                steps.extend(dataclasses.replace(o, metrics=None) for o in engine.step())
            outputs.append(steps)
        assert outputs[1] == outputs[0] and outputs[0][-1].finished
        assert on.output_side.worker.num_child_requests == 0
    finally:
        on.shutdown()


def test_a_killed_output_process_fails_generate_and_shutdown_still_works(tiny_llama):
    """The child dies mid-run (killed between two steps): generate raises (no hang), the requests are
    aborted and their blocks freed; the engine's shutdown is still clean."""
    from pagedinfer.engine.overlap.process import OutputProcessError

    llm = LLM(model=str(tiny_llama), dtype="float32", max_model_len=256, num_gpu_blocks_override=32, overlap="process")
    engine = llm.llm_engine
    side = engine.output_side.worker
    real_execute, calls = engine.runner.execute, []

    def execute(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(side.pid, signal.SIGKILL)
            side._proc.wait(BOUNDED_WAIT_SECONDS)
        return real_execute(*args, **kwargs)

    engine.runner.execute = execute
    with pytest.raises(OutputProcessError, match="died"):
        llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(calls) == 3 and not engine.has_unfinished_requests()
    assert_pool_free(engine)
    llm.shutdown()
    llm.shutdown()  # idempotent


def test_the_output_process_is_a_fresh_interpreter_that_exits_with_the_engine(tiny_llama):
    """Spawned, not forked (its command line is its own, not the engine's); shutdown closes its pipe and it
    exits cleanly on the EOF."""
    llm = LLM(model=str(tiny_llama), dtype="float32", max_model_len=256, num_gpu_blocks_override=32, overlap="process")
    side = llm.llm_engine.output_side.worker
    try:
        with open(f"/proc/{side.pid}/cmdline", "rb") as cmdline:
            assert b"pagedinfer.engine.overlap.process import serve" in cmdline.read()
        assert llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=3))[0].outputs[0].text
    finally:
        llm.shutdown()
    assert side._proc.returncode == 0


@pytest.mark.parametrize("bad", ["yes", "on", True, None])
def test_overlap_must_be_a_mode(tiny_llama, bad):
    with pytest.raises(ValueError, match=f"overlap \\(--overlap\\): must be one of off, thread, process, got {bad!r}"):
        EngineConfig(model=str(tiny_llama), overlap=bad)


def test_the_overlap_flag_alone_means_process():
    from pagedinfer.engine.cli import build_parser
    from pagedinfer.engine.engine_args import engine_config_from_args

    parse = build_parser().parse_args
    assert engine_config_from_args(parse(["generate", "--overlap"]), model="m").overlap == "process"
    assert engine_config_from_args(parse(["generate", "--overlap", "thread"]), model="m").overlap == "thread"
    assert engine_config_from_args(parse(["generate"]), model="m").overlap == "off"
