"""The decode graph layer on a CPU: buckets, padding rows that write nothing, and greedy output equal to generate.

On a CPU the buckets are replayed without capture (engine/cuda_graphs/): the same static buffers, padding and
slicing as on CUDA, with the forward run eagerly. Capture itself and the no-host-sync rule need a GPU
(bench/gpu_check.py's engine section).
"""

from __future__ import annotations

import random

import pytest
import torch
from greedy_reference import hf_greedy

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.cuda_graph_buckets import bucket_for, capture_sizes
from pagedinfer.engine import LLM, SamplingParams
from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
from pagedinfer.engine.distributed.step_message import StepInputs


def test_buckets_follow_vllms_pattern_and_are_capped_by_max_num_seqs():
    assert capture_sizes(0, 256) == ()
    assert capture_sizes(16, 256) == (1, 2, 4, 8, 16)
    assert capture_sizes(10, 256) == (1, 2, 4, 8, 10)  # the cap is a bucket: every batch up to it has one
    assert capture_sizes(512, 300) == (1, 2, 4, *range(8, 257, 8), 272, 288, 300)
    assert capture_sizes(512, 512)[-3:] == (480, 496, 512)
    assert capture_sizes(64, 3) == (1, 2, 3)
    sizes = capture_sizes(16, 256)
    assert [bucket_for(n, sizes) for n in (0, 1, 2, 3, 5, 8, 9, 16, 17)] == [None, 1, 2, 4, 8, 8, 16, 16, None]


@pytest.mark.parametrize("value", [-1, True, 2.0, "8"])
def test_a_bad_capture_size_is_a_value_error_naming_the_option(value):
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        EngineConfig(model="m", max_cudagraph_capture_size=value)


@pytest.fixture(scope="module")
def graph_llm(tiny_llama):
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        max_cudagraph_capture_size=16,
        max_model_len=256,
        max_num_seqs=32,
        num_gpu_blocks_override=64,
    )
    yield llm
    llm.llm_engine.shutdown()


def test_greedy_output_equals_generate_at_every_bucket(graph_llm, tiny_llama):
    """Batches of 1, 3, 5 and 9 run at buckets 1, 4, 8 and 16 (and the smaller ones as requests finish)."""
    graphs = graph_llm.llm_engine.runner.decode_graphs
    assert graphs.sizes == (1, 2, 4, 8, 16) and not graphs.captured  # a CPU: replay without capture
    rng = random.Random(1)
    prompts = [[rng.randrange(8, 384) for _ in range(rng.randint(1, 40))] for _ in range(9)]
    want = hf_greedy(tiny_llama, prompts, 10)
    for batch in (1, 3, 5, 9):
        before = dict(graphs.num_runs)
        params = [SamplingParams(temperature=0.0, max_tokens=10 - i % 3, ignore_eos=True) for i in range(batch)]
        outs = graph_llm.generate(prompts[:batch], params)
        assert [o.outputs[0].token_ids for o in outs] == [w[: 10 - i % 3] for i, w in enumerate(want[:batch])]
        assert graphs.num_runs[bucket_for(batch, graphs.sizes)] > before[bucket_for(batch, graphs.sizes)]
    assert all(count > 0 for count in graphs.num_runs.values()), graphs.num_runs
    assert graph_llm.get_stats().num_used_blocks == 0, "blocks leaked"


def test_padding_rows_write_no_kv_and_the_asked_rows_come_back(graph_llm):
    """A decode step of 3 sequences at bucket 4 writes exactly its 3 slots in every layer; rows asked out of
    order come back in that order, equal to the eager path's."""
    runner = graph_llm.llm_engine.runner
    graphs = runner.decode_graphs
    assert graph_llm.get_stats().num_used_blocks == 0  # the pool is ours for this step
    bs = runner.block_size
    seqs = {1001: (5, (3,)), 1002: (bs + 2, (7, 9)), 1003: (1, (11,))}  # seq_id: (seq_len, table)
    runner.batch.apply(TableDeltas(tuple(BlockTableUpdate(seq_id, 0, table) for seq_id, (_, table) in seqs.items())))
    sentinel = 12345.0
    runner.kv_cache.fill_(sentinel)
    step = StepInputs(
        token_ids=[17, 23, 42],
        seq_ids=list(seqs),
        seq_lens=[n for n, _ in seqs.values()],
        query_lens=[1, 1, 1],
        logits_rows=[2, 0],
    )
    before = graphs.num_runs[4]
    logits = runner.run_step(step)
    assert graphs.num_runs[4] == before + 1
    flat = runner.kv_cache.view(2, runner.num_layers, -1, runner.num_kv_heads, runner.head_dim)
    written = {table[(n - 1) // bs] * bs + (n - 1) % bs for n, table in seqs.values()}
    changed = (flat != sentinel).any(dim=(-1, -2)).any(dim=(0, 1)).nonzero().flatten().tolist()
    assert set(changed) == written, f"slots written: {changed}, expected only {sorted(written)}"
    assert (flat[:, :, sorted(written)] != sentinel).all()  # every layer, K and V, of each real slot

    runner.kv_cache.fill_(sentinel)  # the same step on the eager path
    runner.decode_graphs = None
    try:
        eager = runner.run_step(step)
    finally:
        runner.decode_graphs = graphs
    assert logits.shape == eager.shape == (2, runner.vocab_size)
    torch.testing.assert_close(logits, eager, rtol=1e-4, atol=1e-4)
    runner.batch.apply(TableDeltas((), tuple(seqs)))
    assert not set(seqs) & set(runner.batch.row_of)


def test_the_gpus_forward_and_kernels_in_the_buckets_equal_generate(make_model, monkeypatch):
    """Our Triton decoder and attention (the CUDA path, on the CPU interpreter) replayed with the metadata a
    capture holds: host lengths at max_model_len (600: two decode key splits, most of them empty here)."""
    from pagedinfer.kernels import dispatch

    model_dir = make_model("llama")
    prompts = [[5], [12, 13, 14, 15, 16, 17, 18], [40, 41, 42]]
    want = hf_greedy(model_dir, prompts, 4)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        forward="triton",
        block_size=8,
        max_model_len=600,
        max_cudagraph_capture_size=4,
        num_gpu_blocks_override=80,
    )
    graphs = llm.llm_engine.runner.decode_graphs
    assert graphs.device_lengths and graphs.capture_metadata(4).seq_lens_cpu == [600] * 4
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (4, 2, 3)]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == [w[:n] for w, n in zip(want, (4, 2, 3))]
    assert graphs.num_runs[4] > 0 and graphs.num_runs[2] > 0 and graphs.num_runs[1] > 0, graphs.num_runs
    assert llm.get_stats().num_used_blocks == 0


def test_graphs_with_tensor_parallelism_on_cuda_are_refused_naming_the_option():
    """Checked before any CUDA call, so a CPU can check it; on a CPU the ranks replay their buckets (exact)."""
    from pagedinfer.engine.cuda_graphs.setup import make_decode_graphs

    config = EngineConfig(model="m", max_cudagraph_capture_size=8, tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"max_cudagraph_capture_size .*tensor_parallel_size 2"):
        make_decode_graphs(config, torch.device("cuda"), lambda *a: None, 128, None)
    assert make_decode_graphs(EngineConfig(model="m"), torch.device("cuda"), lambda *a: None, 128, None) is None
