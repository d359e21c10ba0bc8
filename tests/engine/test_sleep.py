"""Sleep releases the KV pool and empties the prefix cache (saying so on the KV events); wake brings the same pool
back, and greedy output after a sleep and a wake equals the output before."""

from __future__ import annotations

import pytest
import torch
import transformers

from pagedinfer.contracts.kv_events.events import AllBlocksCleared
from pagedinfer.engine.llm import LLM
from pagedinfer.engine.sampling_params import SamplingParams
from pagedinfer.engine.sleep.sleeper import EngineSleep, SleepRefused
from pagedinfer.engine.sleep.weights import offload, restore

PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69], [2, 4, 6, 8]]


def _greedy(llm: LLM) -> list[list[int]]:
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    return [list(out.outputs[0].token_ids) for out in outputs]


def test_sleep_empties_cache_and_pool_wake_restores_the_pool_and_greedy_output_is_unchanged(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_model_len=128, num_gpu_blocks_override=32, block_size=16)
    engine = llm.llm_engine
    events = []
    engine.kv.pool.event_sink = events.append
    before = _greedy(llm)
    assert engine.kv.pool.cached  # the first prompt's full block stayed cached
    sleeper = EngineSleep(engine)

    engine.add_request("busy", PROMPTS[1], SamplingParams(max_tokens=4))
    with pytest.raises(SleepRefused, match="1 requests in flight"):
        sleeper.sleep()
    engine.abort_request("busy")

    report = sleeper.sleep()
    assert report.is_sleeping and report.kv_bytes == 32 * engine.bytes_per_block
    assert report.weight_bytes == 0  # a CPU engine's weights are host memory already: they stay
    assert engine.runner.kv_cache.numel() == 0 and not engine.kv.pool.cached
    assert isinstance(events[-1], AllBlocksCleared)
    assert engine.get_stats().num_free_blocks == 32
    assert sleeper.sleep().kv_bytes == 0  # asleep already: nothing changes

    woke = sleeper.wake()
    assert not woke.is_sleeping and woke.kv_bytes == report.kv_bytes
    assert engine.runner.kv_cache.shape[2] == 32
    assert _greedy(llm) == before


def test_weights_moved_storage_by_storage_come_back_bit_for_bit_and_views_held_elsewhere_see_them(tiny_llama):
    """The CUDA path's mechanism, run on CPU storages (a predicate chooses what moves): each storage is freed
    (resized to 0) and filled again, so a view of a weight held outside the model (a fused plan) stays valid."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama)
    for tensor in [*model.parameters(), *model.buffers()]:  # allocator memory, as on a device (not a mapped file)
        tensor.data = tensor.data.clone()
    before = {name: t.detach().clone() for name, t in model.state_dict().items()}
    weight = model.model.layers[0].mlp.up_proj.weight
    held_view = weight.detach()[:3]
    offloaded = offload(model, moves=lambda t: True)
    assert offloaded.num_bytes > 0 and weight.untyped_storage().nbytes() == 0
    restore(offloaded)
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())
    assert torch.equal(held_view, before["model.layers.0.mlp.up_proj.weight"][:3])
