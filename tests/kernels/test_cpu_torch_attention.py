"""The vectorised torch attention (the CPU fallback) agrees with the plain reference.

It groups sequences by length and pads within a group; these steps make the
groups scattered (not slices of the batch) and check the grouping itself.
"""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels import reference
from pagedinfer.kernels.cpu import torch_attention
from pagedinfer.kernels.problems import make_problem


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mixed_step_equals_the_plain_reference(dtype):
    problem = make_problem([3, 17, 16, 40], [1, 1, 16, 9], 8, 2, head_dim=16, block_size=8, dtype=dtype)
    for window in (None, 6):
        out = torch_attention.paged_attention(
            problem.query,
            problem.key_cache,
            problem.value_cache,
            problem.metadata,
            problem.scale,
            sliding_window=window,
        )
        expected = reference.paged_attention(
            problem.query,
            problem.key_cache,
            problem.value_cache,
            problem.metadata,
            problem.scale,
            sliding_window=window,
        )
        assert out.dtype == dtype
        torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)


def test_skewed_lengths_split_into_scattered_groups_still_equal_dense_sdpa():
    # unsorted decodes of very different lengths, then prefill chunks: groups are not slices of the batch
    seq_lens = [700, 3, 650, 5, 40, 690, 2, 300, 4, 280]
    query_lens = [1, 1, 1, 1, 1, 1, 1, 300, 4, 100]
    problem = make_problem(seq_lens, query_lens, 8, 4, head_dim=16, block_size=16, seed=2)
    assert len(torch_attention._group_plans(problem.metadata, 16)) > 2
    for window in (None, 64):
        out = torch_attention.paged_attention(
            problem.query,
            problem.key_cache,
            problem.value_cache,
            problem.metadata,
            problem.scale,
            sliding_window=window,
        )
        expected = reference.paged_attention(
            problem.query,
            problem.key_cache,
            problem.value_cache,
            problem.metadata,
            problem.scale,
            sliding_window=window,
        )
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_split_by_length_covers_every_sequence_once_and_keeps_long_apart_from_short():
    seq_lens = [900, 3, 880, 4, 5, 910]
    groups = torch_attention.split_by_length(seq_lens, [1] * len(seq_lens))
    assert sorted(i for g in groups for i in g) == list(range(len(seq_lens)))
    assert sorted(map(sorted, groups)) == [[0, 2, 5], [1, 3, 4]]
