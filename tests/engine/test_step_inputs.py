"""Step inputs written into buffers kept across steps (engine/batch/step_inputs.py): no earlier step leaks into a step."""

from __future__ import annotations

import torch

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
from pagedinfer.engine.batch.step_inputs import IndexBuffer
from pagedinfer.engine.distributed.step_message import StepInputs
from pagedinfer.engine.runner.model_runner import ModelRunner


def test_a_put_is_exactly_the_values_written_after_a_longer_one_and_across_growth():
    buffer = IndexBuffer("cpu", capacity=4)
    assert buffer.put([7, 8, 9]).tolist() == [7, 8, 9]
    long = list(range(100, 110))  # past the capacity: grows (at least doubling), nothing of before kept
    assert buffer.put(long).tolist() == long and buffer.capacity >= 10
    short = buffer.put([3, 4])
    assert short.tolist() == [3, 4] and short.dtype == torch.int64
    assert buffer.put([]).shape == (0,)


def _runner(model) -> ModelRunner:
    runner = ModelRunner(
        EngineConfig(
            model=str(model), dtype="float32", device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=4
        )
    )
    runner.allocate_kv_cache(8, 0)
    return runner


def _short_step() -> StepInputs:
    """Sequence 2: a 5-token prompt in block 5, logits of its last token."""
    return StepInputs([11, 12, 13, 14, 15], [2], [5], [5], [4], TableDeltas((BlockTableUpdate(2, 0, (5,)),)))


def test_a_short_step_after_a_long_one_equals_a_fresh_runners(tiny_llama):
    """The reused token-id and logits-row buffers hold a 40-token step's rows when the 5-token step comes:
    its logits must be exactly a fresh runner's (a stale row, a longer view or an unwritten entry changes them)."""
    runner = _runner(tiny_llama)
    long = StepInputs(
        list(range(20, 60)), [1], [40], [40], list(range(40)), TableDeltas((BlockTableUpdate(1, 0, (0, 1, 2)),))
    )
    assert runner.run_step(long).shape[0] == 40
    after_long = runner.run_step(_short_step())
    fresh = _runner(tiny_llama).run_step(_short_step())
    assert after_long.shape == fresh.shape == (1, runner.vocab_size)
    assert torch.equal(after_long, fresh)
