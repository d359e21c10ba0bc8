"""Triton write_kv, copy_blocks and swap_blocks (interpreter) match their torch references."""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels import reference
from pagedinfer.kernels.block_copy import copy_blocks_triton, swap_blocks_triton
from pagedinfer.kernels.write_kv import write_kv_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_kv_heads,head_dim,block_size", [(2, 16, 8), (3, 24, 16), (1, 80, 32)])
def test_write_kv_scatters_strided_rows_and_skips_padding(dtype, num_kv_heads, head_dim, block_size):
    generator = torch.Generator().manual_seed(head_dim)
    num_tokens = 7
    qkv = torch.randn(num_tokens, 4 * num_kv_heads * head_dim, generator=generator).to(dtype)
    key = qkv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, 3 * num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(5 * block_size, generator=generator)[:num_tokens]
    slots[2] = -1
    cache_shape = (5, block_size, num_kv_heads, head_dim)
    caches = [torch.zeros(cache_shape, dtype=dtype) for _ in range(4)]
    write_kv_triton(key, value, caches[0], caches[1], slots)
    reference.write_kv(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert int(caches[0].flatten(0, 1).any(-1).any(-1).sum()) == num_tokens - 1


def test_write_kv_names_a_mismatched_slot_mapping():
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_triton(
            torch.zeros(3, 1, 8), torch.zeros(3, 1, 8), cache, cache.clone(), torch.zeros(3, dtype=torch.int32)
        )


def engine_like_allocation(num_layers=3, num_blocks=6, dtype=torch.float16):
    """The engine's single [2, num_layers, num_blocks, block_size, num_kv_heads, head_dim] tensor."""
    return torch.randn(2, num_layers, num_blocks, 4, 2, 8, generator=torch.Generator().manual_seed(1)).to(dtype)


def test_copy_blocks_on_engine_views_copies_every_layer():
    allocation = engine_like_allocation()
    expected = allocation.clone()
    mapping = torch.tensor([[0, 3], [2, 5], [1, 4]])
    reference.copy_blocks(list(expected[0].unbind(0)), list(expected[1].unbind(0)), mapping)
    copy_blocks_triton(list(allocation[0].unbind(0)), list(allocation[1].unbind(0)), mapping)
    assert torch.equal(allocation, expected)


def test_copy_blocks_on_separately_allocated_layers():
    key_caches = [torch.randn(5, 4, 1, 8) for _ in range(2)]
    value_caches = [torch.randn(5, 4, 1, 8) for _ in range(2)]
    expected = [c.clone() for c in key_caches + value_caches]
    mapping = torch.tensor([[4, 0]])
    reference.copy_blocks(expected[:2], expected[2:], mapping)
    copy_blocks_triton(key_caches, value_caches, mapping)
    for got, want in zip(key_caches + value_caches, expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    "mapping,message",
    [
        (torch.tensor([[0, 3], [1, 3]]), "distinct"),
        (torch.tensor([[0, 3], [3, 4]]), "also a source"),
        (torch.tensor([[0, 6]]), r"\[0, 6\)"),
        (torch.tensor([0, 3]), r"\[n, 2\]"),
    ],
)
def test_copy_blocks_rejects_unsafe_mappings(mapping, message):
    allocation = engine_like_allocation()
    for copy in (copy_blocks_triton, reference.copy_blocks):
        with pytest.raises(ValueError, match=message):
            copy(list(allocation[0].unbind(0)), list(allocation[1].unbind(0)), mapping)


@pytest.mark.parametrize("block_dim", [0, 2])
def test_swap_blocks_matches_the_reference(block_dim):
    allocation = engine_like_allocation(dtype=torch.float32)
    src = allocation if block_dim == 2 else allocation[0, 1]
    host_shape = list(src.shape)
    host_shape[block_dim] = 4
    host, expected = torch.zeros(host_shape), torch.zeros(host_shape)
    mapping = torch.tensor([[5, 0], [1, 3], [2, 2]])
    swap_blocks_triton(src, host, mapping, block_dim)
    reference.swap_blocks(src, expected, mapping, block_dim)
    assert torch.equal(host, expected)
    back, back_expected = torch.zeros_like(src), torch.zeros_like(src)
    swap_blocks_triton(host, back, mapping.flip(1), block_dim)
    reference.swap_blocks(host, back_expected, mapping.flip(1), block_dim)
    assert torch.equal(back, back_expected)
