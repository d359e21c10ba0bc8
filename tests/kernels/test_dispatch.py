"""The dispatcher picks a backend from the device and PAGEDINFER_ATTENTION, read at call time."""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels import dispatch
from pagedinfer.kernels.problems import dense_attention, make_problem


def test_cpu_tensors_use_the_torch_reference_by_default(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert dispatch.backend_for(torch.device("cpu")) == "torch"
    assert dispatch.backend_for(torch.device("cuda")) == "triton"


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
        dispatch.paged_attention(problem.query, problem.key_cache, problem.value_cache, problem.metadata,
                                 problem.scale, sliding_window=0)


def test_torch_backend_attention_matches_dense(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    problem = make_problem([6, 19], [1, 11], 4, 2, head_dim=8, block_size=8)
    out = dispatch.paged_attention(problem.query, problem.key_cache, problem.value_cache, problem.metadata,
                                   problem.scale)
    torch.testing.assert_close(out, dense_attention(problem), rtol=1e-5, atol=1e-5)
