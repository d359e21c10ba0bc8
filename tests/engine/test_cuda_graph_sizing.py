"""The decode graphs' memory in the KV plan: one estimate (contracts/sizing.py), the same in the engine and `plan`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from pagedinfer.contracts import sizing
from pagedinfer.contracts.cuda_graph_buckets import capture_sizes
from pagedinfer.contracts.model_shape import ModelShape
from pagedinfer.engine import LLM

LLAMA3_8B = ModelShape(
    num_layers=32,
    num_kv_heads=8,
    head_dim=128,
    num_parameters=8_030_261_248,
    dtype="bfloat16",
    hidden_size=4096,
    max_position_embeddings=8192,
    vocab_size=128256,
)


def test_the_graph_term_is_the_documented_estimate_and_costs_blocks():
    inputs = sizing.SizingInputs(
        shape=LLAMA3_8B,
        gpu_memory_bytes=80 * 2**30,
        max_model_len=8192,
        max_num_seqs=512,
        max_cudagraph_capture_size=512,
    )
    rows, width, vocab = 512, 8192 // 16, 128256
    static = rows * (sizing.GRAPH_INDEX_BYTES_PER_ROW + 4 * width + 2 * vocab)
    pool = rows * (sizing.ACTIVATION_HIDDEN_MULTIPLE * 4096 * 2 + 4 * vocab)
    expected = static + pool + len(capture_sizes(512, 512)) * sizing.GRAPH_OVERHEAD_BYTES
    with_graphs = sizing.plan_kv_cache(inputs)
    without = sizing.plan_kv_cache(dataclasses.replace(inputs, max_cudagraph_capture_size=0))
    assert with_graphs.cuda_graph_bytes == expected and without.cuda_graph_bytes == 0
    assert without.usable_bytes - with_graphs.usable_bytes == expected
    assert with_graphs.num_gpu_blocks < without.num_gpu_blocks
    # the buckets stop at max_num_seqs: a larger capture size costs nothing more
    assert sizing.plan_kv_cache(dataclasses.replace(inputs, max_cudagraph_capture_size=4096)) == with_graphs


def test_a_plan_that_does_not_fit_names_the_graphs():
    tight = sizing.SizingInputs(
        shape=LLAMA3_8B,
        gpu_memory_bytes=17 * 2**30,
        max_model_len=8192,
        max_num_seqs=512,
        max_cudagraph_capture_size=512,
    )
    with pytest.raises(sizing.InsufficientMemoryError, match=r"decode graphs .* \(max_cudagraph_capture_size=512\)"):
        sizing.plan_kv_cache(tight)
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        dataclasses.replace(tight, max_cudagraph_capture_size=-1)


def plan(model, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "pagedinfer.engine.cli", "plan", "--model", str(model), *flags],
        capture_output=True,
        text=True,
        check=True,
    )


def test_a_cpu_engine_sizes_its_graphs_as_plan_does(tiny_llama):
    """The engine's own plan and `pagedinfer plan` for the same flags: the same graph term, the same blocks;
    with graphs, fewer blocks than without."""
    flags = dict(max_model_len=256, cpu_memory_budget_bytes=64 << 20, max_num_seqs=16, max_cudagraph_capture_size=8)
    llm = LLM(model=str(tiny_llama), device="cpu", **flags)
    engine = llm.llm_engine
    try:
        args = ["--device", "cpu", "--gpu-memory", str(64 << 20), "--max-model-len", "256", "--max-num-seqs", "16"]
        planned = json.loads(plan(tiny_llama, *args, "--max-cudagraph-capture-size", "8", "--json").stdout)
        without = json.loads(plan(tiny_llama, *args, "--json").stdout)
        assert engine.sizing.cuda_graph_bytes == planned["cuda_graph_bytes"] > 0 == without["cuda_graph_bytes"]
        assert engine.runner.decode_graphs.planned_bytes == engine.sizing.cuda_graph_bytes
        assert engine.num_gpu_blocks == planned["num_gpu_blocks"] < without["num_gpu_blocks"]
        text = plan(tiny_llama, *args, "--max-cudagraph-capture-size", "8").stdout
        assert "decode graphs (estimate)" in text and "--max-cudagraph-capture-size 8" in text
    finally:
        engine.shutdown()


def test_the_operator_refuses_a_negative_capture_size_naming_the_field():
    from pagedinfer.operator.spec.crd_model import SpecError
    from pagedinfer.operator.spec.parser import parse_spec

    with pytest.raises(SpecError, match=r"spec\.engine\.maxCudagraphCaptureSize"):
        parse_spec("x", {"engine": {"maxCudagraphCaptureSize": -1}})
    assert parse_spec("x", {"engine": {"maxCudagraphCaptureSize": 64}}).engine.max_cudagraph_capture_size == 64
