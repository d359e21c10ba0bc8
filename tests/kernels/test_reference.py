"""The plain torch references agree with dense SDPA on gathered K/V and honour the cache contract."""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels import reference
from pagedinfer.kernels.problems import dense_attention, make_problem

# (seq_lens, query_lens): decodes first, then prefill chunks with and without cached prefixes.
STEPS = [
    ([5], [1]),
    ([16, 9, 33], [1, 1, 1]),
    ([7], [7]),
    ([3, 17, 16, 40], [1, 1, 16, 9]),
    ([1, 32], [1, 32]),
]


@pytest.mark.parametrize("seq_lens,query_lens", STEPS)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2)])
@pytest.mark.parametrize("block_size", [8, 16])
def test_paged_attention_equals_dense_sdpa(seq_lens, query_lens, num_heads, num_kv_heads, block_size):
    problem = make_problem(seq_lens, query_lens, num_heads, num_kv_heads, head_dim=16, block_size=block_size)
    out = reference.paged_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale
    )
    torch.testing.assert_close(out, dense_attention(problem), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 4, 9, 100])
def test_sliding_window_hides_keys_at_or_before_p_minus_w(window):
    problem = make_problem([20, 13, 30], [1, 5, 30], 4, 2, head_dim=8, block_size=8, seed=3)
    out = reference.paged_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, sliding_window=window
    )
    torch.testing.assert_close(out, dense_attention(problem, sliding_window=window), rtol=1e-5, atol=1e-5)


def test_half_precision_caches_are_attended_in_float32():
    problem = make_problem([9, 24], [1, 10], 4, 1, head_dim=32, block_size=8, dtype=torch.float16, seed=1)
    out = reference.paged_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale
    )
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), dense_attention(problem), rtol=2e-3, atol=2e-3)


def test_write_kv_fills_slots_and_skips_padding():
    key_cache = torch.zeros(4, 4, 2, 3)
    value_cache = torch.zeros(4, 4, 2, 3)
    key = torch.randn(3, 2, 3)
    value = torch.randn(3, 2, 3)
    slot_mapping = torch.tensor([13, -1, 2])
    reference.write_kv(key, value, key_cache, value_cache, slot_mapping)
    torch.testing.assert_close(key_cache[3, 1], key[0])
    torch.testing.assert_close(value_cache[0, 2], value[2])
    assert int((key_cache != 0).any(-1).any(-1).sum()) == 2


def test_copy_blocks_copies_every_layer():
    key_caches = [torch.randn(5, 2, 1, 4) for _ in range(2)]
    value_caches = [torch.randn(5, 2, 1, 4) for _ in range(2)]
    before = [c.clone() for c in key_caches + value_caches]
    reference.copy_blocks(key_caches, value_caches, torch.tensor([[0, 3], [2, 4]]))
    for old, new in zip(before, key_caches + value_caches):
        torch.testing.assert_close(new[3], old[0])
        torch.testing.assert_close(new[4], old[2])
        torch.testing.assert_close(new[:3], old[:3])


def test_swap_blocks_moves_blocks_along_the_block_axis():
    device_cache = torch.randn(2, 3, 6, 2, 1, 4)
    host_cache = torch.zeros(2, 3, 4, 2, 1, 4)
    reference.swap_blocks(device_cache, host_cache, torch.tensor([[5, 0], [1, 3]]), block_dim=2)
    torch.testing.assert_close(host_cache[:, :, 0], device_cache[:, :, 5])
    torch.testing.assert_close(host_cache[:, :, 3], device_cache[:, :, 1])
    assert not host_cache[:, :, 1:3].any()
