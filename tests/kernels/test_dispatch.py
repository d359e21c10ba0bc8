"""The dispatcher picks a backend from the device and PAGEDINFER_ATTENTION, read at call time."""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels import dispatch
from pagedinfer.kernels.problems import dense_attention, make_problem


def test_cpu_tensors_use_the_native_kernels_by_default(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert dispatch.backend_for(torch.device("cpu")) == "native"
    assert dispatch.backend_for(torch.device("cuda")) == "triton"


def test_native_on_cuda_tensors_is_refused(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "native")
    with pytest.raises(ValueError, match="native runs on CPU tensors only"):
        dispatch.backend_for(torch.device("cuda"))


def test_the_environment_variable_is_read_at_every_call(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    assert dispatch.backend_for(torch.device("cpu")) == "triton"
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    assert dispatch.backend_for(torch.device("cuda")) == "torch"


def test_an_unknown_backend_is_named_in_the_error(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "cuda-graphs")
    with pytest.raises(ValueError, match="PAGEDINFER_ATTENTION"):
        dispatch.backend_for(torch.device("cpu"))


def test_a_non_positive_sliding_window_is_rejected(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    problem = make_problem([4], [1], 2, 2, head_dim=8, block_size=8)
    with pytest.raises(ValueError, match="sliding_window"):
        dispatch.paged_attention(
            problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, sliding_window=0
        )


def test_torch_backend_attention_matches_dense(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    problem = make_problem([6, 19], [1, 11], 4, 2, head_dim=8, block_size=8)
    out = dispatch.paged_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale
    )
    torch.testing.assert_close(out, dense_attention(problem), rtol=1e-5, atol=1e-5)


def test_forced_triton_runs_the_triton_kernels(monkeypatch):
    problem = make_problem([4, 9], [1, 3], 2, 2, head_dim=272, block_size=8)
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    dispatch.paged_attention(problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    with pytest.raises(ValueError, match="at most 256"):
        dispatch.paged_attention(problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale)


def test_every_op_agrees_across_backends(monkeypatch, native_cpu_kernels):
    problem = make_problem([6, 19], [1, 11], 4, 2, head_dim=16, block_size=8, dtype=torch.float16)
    key = torch.randn(problem.metadata.num_tokens, 2, 16).half()
    results = {}
    for backend in dispatch.BACKENDS:
        monkeypatch.setenv(dispatch.ENV_VAR, backend)
        key_cache, value_cache = problem.key_cache.clone(), problem.value_cache.clone()
        dispatch.write_kv(key, -key, key_cache, value_cache, problem.metadata.slot_mapping)
        out = dispatch.paged_attention(problem.query, key_cache, value_cache, problem.metadata, problem.scale)
        dispatch.copy_blocks([key_cache], [value_cache], torch.tensor([[0, 1]]))
        host = torch.zeros_like(key_cache)
        dispatch.swap_blocks(key_cache, host, torch.tensor([[1, 2]]))
        results[backend] = (out, key_cache, value_cache, host)
    for backend in ("native", "triton"):
        for torch_result, result in zip(results["torch"], results[backend]):
            torch.testing.assert_close(result, torch_result, rtol=3e-3, atol=3e-3, equal_nan=True)
