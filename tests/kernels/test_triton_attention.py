"""The Triton paged attention (interpreter) agrees with the torch reference and with dense SDPA.

Every problem puts its K/V in shuffled, non-contiguous physical blocks and
fills every unowned cache slot with NaN, so reading a wrong block or a slot
past a sequence's end shows up as NaN.
"""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels import reference
from pagedinfer.kernels.metadata import build_attention_metadata
from pagedinfer.kernels.paged_attention import (
    MAX_SPLITS,
    choose_num_splits,
    decode_attention,
    decode_visible_keys,
    paged_attention_triton,
    prefill_attention,
)
from pagedinfer.kernels.problems import dense_attention, make_problem

TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3}

# Decodes ending mid-block and on a block boundary (16, 32), then a prefill
# after a cached prefix (40 = 29 cached + 11 new) and a fresh prefill.
MIXED_SEQ_LENS = [16, 9, 32, 40, 13]
MIXED_QUERY_LENS = [1, 1, 1, 11, 13]


def run_and_compare(problem, out, sliding_window=None):
    dtype = problem.query.dtype
    expected = reference.paged_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, sliding_window
    )
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    torch.testing.assert_close(
        out.float(), dense_attention(problem, sliding_window), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_decode_and_prefill_step(block_size, group, dtype):
    problem = make_problem(
        MIXED_SEQ_LENS,
        MIXED_QUERY_LENS,
        num_heads=2 * group,
        num_kv_heads=2,
        head_dim=16,
        block_size=block_size,
        dtype=dtype,
        seed=block_size + group,
    )
    out = paged_attention_triton(problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale)
    run_and_compare(problem, out)


@pytest.mark.parametrize("block_size", [64, 128])
def test_large_blocks(block_size):
    problem = make_problem(
        [130, 64, 200],
        [1, 1, 70],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=block_size,
        dtype=torch.float16,
        seed=block_size,
    )
    out = paged_attention_triton(problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale)
    run_and_compare(problem, out)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_head_dims_including_non_powers_of_two(head_dim):
    problem = make_problem(
        [21, 8, 19], [1, 8, 5], num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=16, seed=head_dim
    )
    out = paged_attention_triton(problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale)
    run_and_compare(problem, out)


@pytest.mark.parametrize("window", [1, 5, 16, 64])
def test_sliding_window(window):
    problem = make_problem(
        [37, 20, 45], [1, 1, 30], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, seed=window
    )
    out = paged_attention_triton(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, sliding_window=window
    )
    run_and_compare(problem, out, sliding_window=window)


@pytest.mark.parametrize("num_splits", [2, 3, 7])
@pytest.mark.parametrize("window", [None, 20])
def test_split_k_decode_merges_to_the_same_result(num_splits, window):
    problem = make_problem(
        [97, 64, 5], [1, 1, 1], num_heads=8, num_kv_heads=2, head_dim=16, block_size=16, seed=num_splits
    )
    out = decode_attention(
        problem.query,
        problem.key_cache,
        problem.value_cache,
        problem.metadata,
        problem.scale,
        window,
        num_splits=num_splits,
        tile_n=16,
    )
    run_and_compare(problem, out, sliding_window=window)


@pytest.mark.parametrize("tile_n,block_size", [(16, 32), (32, 8)])
def test_key_tiles_smaller_and_larger_than_a_block(tile_n, block_size):
    problem = make_problem([50, 33], [1, 20], num_heads=2, num_kv_heads=1, head_dim=16, block_size=block_size)
    out = decode_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, tile_n=tile_n
    )
    prefill_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, out=out, tile_n=tile_n
    )
    run_and_compare(problem, out)


def test_long_chunk_spans_several_query_tiles():
    problem = make_problem([70, 45], [50, 45], num_heads=4, num_kv_heads=1, head_dim=16, block_size=16)
    out = prefill_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, block_m=16
    )
    run_and_compare(problem, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_key_tiles_before_the_first_query_run_unmasked(dtype):
    """A chunk after a long cached prefix: most key tiles precede every query of a program (the kernel's unmasked
    loop), the rest straddle the diagonal; several query tiles, heaviest first; and split-K decodes beside it."""
    problem = make_problem(
        [150, 130, 203], [1, 1, 37], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, dtype=dtype
    )
    out = decode_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, num_splits=3, tile_n=16
    )
    prefill_attention(
        problem.query,
        problem.key_cache,
        problem.value_cache,
        problem.metadata,
        problem.scale,
        out=out,
        block_m=16,
        tile_n=16,
    )
    run_and_compare(problem, out)


def test_grouped_query_ratio_that_is_not_a_power_of_two():
    problem = make_problem([12, 30], [1, 6], num_heads=6, num_kv_heads=2, head_dim=16, block_size=8)
    out = paged_attention_triton(problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale)
    run_and_compare(problem, out)


def test_split_heuristic_fills_the_gpu_only_when_programs_are_few():
    assert choose_num_splits(num_seqs=256, num_kv_heads=8, max_visible_keys=32768, num_sms=132) == 1
    assert choose_num_splits(num_seqs=1, num_kv_heads=8, max_visible_keys=32768, num_sms=132) == MAX_SPLITS
    assert choose_num_splits(num_seqs=16, num_kv_heads=8, max_visible_keys=2048, num_sms=132) > 1
    assert choose_num_splits(num_seqs=1, num_kv_heads=8, max_visible_keys=300, num_sms=132) == 1


def test_splits_count_the_keys_a_sliding_window_leaves_visible():
    meta = build_attention_metadata([32768, 900, 40], [1, 1, 30], [[0] * 2048, [0] * 57, [0] * 3], block_size=16)
    assert decode_visible_keys(meta, sliding_window=None) == 32768
    assert decode_visible_keys(meta, sliding_window=256) == 256
    assert decode_visible_keys(meta, sliding_window=65536) == 32768
    assert choose_num_splits(1, 8, decode_visible_keys(meta, sliding_window=256), num_sms=132) == 1


@pytest.mark.parametrize(
    "name,bad,message",
    [
        ("query", lambda p: p.query[:, :, :8], "head_dim"),
        ("query", lambda p: p.query[:, :3], "multiple of num_kv_heads"),
        ("key_cache", lambda p: p.key_cache.half(), "dtype"),
        ("query", lambda p: p.query.transpose(1, 2).contiguous().transpose(1, 2), "unit stride"),
        ("query", lambda p: p.query[:2], "tokens"),
    ],
)
def test_bad_inputs_are_named(name, bad, message):
    problem = make_problem([5, 7], [1, 2], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8)
    args = dict(query=problem.query, key_cache=problem.key_cache, value_cache=problem.value_cache)
    args[name] = bad(problem)
    with pytest.raises(ValueError, match=message):
        paged_attention_triton(args["query"], args["key_cache"], args["value_cache"], problem.metadata, problem.scale)
