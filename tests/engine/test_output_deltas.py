"""Output deltas: what step_deltas() hands out, accumulated, is exactly what step() returns, step by step."""

from __future__ import annotations

import dataclasses

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine import SamplingParams
from pagedinfer.engine.beam.params import BeamSearchParams
from pagedinfer.engine.llm_engine import LLMEngine
from pagedinfer.engine.outputs import OutputAccumulator

REQUESTS = [
    ("greedy", "the quick brown fox", SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2)),
    ("n2", "jumps over", SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=7, ignore_eos=True, logprobs=0)),
    ("stop", "a lazy dog", SamplingParams(temperature=1.0, seed=5, max_tokens=12, stop=["e", "a "])),
    ("prompt-lp", list(range(30, 70)), SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=3)),
    ("beam", "hello there", BeamSearchParams(beam_width=2, max_tokens=4)),
]


def comparable(out):
    """A RequestOutput without its timings (two engines never share a clock)."""
    return dataclasses.replace(out, metrics=None)


def test_accumulated_deltas_equal_the_cumulative_outputs_at_every_step(tiny_llama):
    # two identical engines in lockstep: one answers step(), the other step_deltas()
    config = EngineConfig(
        model=str(tiny_llama),
        block_size=8,
        max_model_len=128,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=24,
        dtype="float32",
        seed=11,
    )  # chunked prompts
    cumulative, incremental = LLMEngine(config), LLMEngine(config)
    for request_id, prompt, params in REQUESTS:
        cumulative.add_request(request_id, prompt, params)
        incremental.add_request(request_id, prompt, params)
    accumulator = OutputAccumulator()
    num_new_tokens = 0
    finals = {}
    while cumulative.has_unfinished_requests():
        want = cumulative.step()
        deltas = incremental.step_deltas()
        assert [d.request_id for d in deltas] == [o.request_id for o in want]
        num_new_tokens += sum(len(c.new_token_ids) for d in deltas for c in d.outputs)
        got = [accumulator.add(d) for d in deltas]
        assert [comparable(o) for o in got] == [comparable(o) for o in want]
        finals.update((o.request_id, o) for o in got if o.finished)
    assert not incremental.has_unfinished_requests() and not accumulator.outputs
    assert sorted(finals) == sorted(r[0] for r in REQUESTS)
    assert finals["prompt-lp"].prompt_logprobs is not None and finals["greedy"].outputs[0].logprobs
    # every token crossed once, never a second time with each later step
    assert num_new_tokens == sum(len(c.token_ids) for o in finals.values() for c in o.outputs)
