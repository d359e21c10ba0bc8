"""The native CPU paged attention and KV write agree with the plain torch reference.

Every problem puts its K/V in shuffled, non-contiguous physical blocks and
fills every slot no sequence owns with NaN (`make_problem`), so a read of a
wrong block, or of a slot past a sequence's end, shows up as NaN.
"""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels import reference
from pagedinfer.kernels.problems import make_problem

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}

# (seq_lens, query_lens): decodes ending mid-block and on block boundaries, then prefill chunks
# after cached prefixes (40 = 29 + 11, 33 = 17 + 16) and fresh prefills, one crossing many blocks.
MIXED = ([16, 9, 32, 17, 40, 33, 13, 70], [1, 1, 1, 1, 11, 16, 13, 70])


def check(problem, out, sliding_window=None):
    expected = reference.paged_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, sliding_window
    )
    assert out.dtype == problem.query.dtype and out.shape == expected.shape
    assert not out.isnan().any()
    tol = TOLERANCE[problem.query.dtype]
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


def attend(ops, problem, sliding_window=None):
    return ops.paged_attention(
        problem.query, problem.key_cache, problem.value_cache, problem.metadata, problem.scale, sliding_window
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("head_dim", [64, 128, 17])
def test_mixed_decode_and_prefill_step_equals_the_reference(native_cpu_kernels, dtype, group, head_dim):
    problem = make_problem(
        *MIXED,
        num_heads=2 * group,
        num_kv_heads=2,
        head_dim=head_dim,
        block_size=16,
        dtype=dtype,
        seed=group + head_dim,
    )
    check(problem, attend(native_cpu_kernels, problem))


@pytest.mark.parametrize("window", [1, 5, 16, 37, 1000])
@pytest.mark.parametrize("block_size", [8, 32])
def test_sliding_window_equals_the_reference(native_cpu_kernels, window, block_size):
    problem = make_problem(*MIXED, num_heads=6, num_kv_heads=2, head_dim=64, block_size=block_size, seed=window)
    check(problem, attend(native_cpu_kernels, problem, window), window)


def test_a_prefill_longer_than_a_row_tile_after_a_cached_prefix(native_cpu_kernels):
    # 200 new tokens after 130 cached, 12 query heads over 4 KV heads: several tiles per sequence
    problem = make_problem(
        [7, 330, 150],
        [1, 200, 150],
        num_heads=12,
        num_kv_heads=4,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        seed=5,
    )
    check(problem, attend(native_cpu_kernels, problem))
    check(problem, attend(native_cpu_kernels, problem, 50), 50)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_fills_slots_skips_padding_and_casts(native_cpu_kernels, dtype):
    key_cache = torch.full((4, 4, 2, 3), float("nan"), dtype=dtype)
    value_cache = key_cache.clone()
    key = torch.randn(2, 4, 3).transpose(0, 1)  # [tokens, kv_heads, head_dim] as a strided view, float32
    value = torch.randn(4, 2, 3)
    slot_mapping = torch.tensor([13, -1, 2, 15])
    expected = key_cache.clone(), value_cache.clone()
    reference.write_kv(key, value, *expected, slot_mapping)
    native_cpu_kernels.write_kv(key, value, key_cache, value_cache, slot_mapping)
    torch.testing.assert_close(key_cache, expected[0], equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(value_cache, expected[1], equal_nan=True, rtol=0, atol=0)


def test_write_kv_names_a_slot_out_of_range(native_cpu_kernels):
    cache = torch.zeros(2, 4, 1, 8)
    key = torch.randn(2, 1, 8)
    with pytest.raises(RuntimeError, match=r"slot_mapping\[1\] = 8 is out of range \[0, 8\)"):
        native_cpu_kernels.write_kv(key, key, cache, cache.clone(), torch.tensor([0, 8]))


def test_the_ops_pass_torch_library_opcheck(native_cpu_kernels):
    problem = make_problem([9, 20], [1, 12], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8)
    meta = problem.metadata
    problem_args = (
        problem.query,
        problem.key_cache.nan_to_num(),
        problem.value_cache.nan_to_num(),
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        problem.scale,
    )
    torch.library.opcheck(torch.ops.pagedinfer.cpu_paged_attention.default, (*problem_args, None))
    torch.library.opcheck(torch.ops.pagedinfer.cpu_paged_attention.default, (*problem_args, 4))
    key = torch.randn(meta.num_tokens, 2, 16)
    torch.library.opcheck(
        torch.ops.pagedinfer.cpu_write_kv.default,
        (key, -key, torch.zeros_like(problem.key_cache), torch.zeros_like(problem.key_cache), meta.slot_mapping),
    )


def test_torch_compile_traces_the_ops_in_one_graph(native_cpu_kernels):
    problem = make_problem([9, 20], [1, 12], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8)
    meta = problem.metadata
    key = torch.randn(meta.num_tokens, 2, 16)

    def step(query, key, key_cache, value_cache):
        native_cpu_kernels.write_kv(key, -key, key_cache, value_cache, meta.slot_mapping)
        return native_cpu_kernels.paged_attention(query, key_cache, value_cache, meta, problem.scale) * 2

    eager_caches = problem.key_cache.clone(), problem.value_cache.clone()
    expected = step(problem.query, key, *eager_caches)
    compiled_caches = problem.key_cache.clone(), problem.value_cache.clone()
    out = torch.compile(step, backend="aot_eager", fullgraph=True)(problem.query, key, *compiled_caches)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(compiled_caches[0], eager_caches[0], equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32])
def test_every_kernel_equals_the_reference_on_the_125m_shapes(native_cpu_kernels, isa, dtype, block_size):
    # 12 query heads over 4 KV heads, head_dim 64: a mixed step (decodes mid-block and on a block
    # boundary, prefill chunks after cached prefixes) and a prefill longer than a row tile after a
    # cached prefix, with and without a sliding window
    for seq_lens, query_lens in (MIXED, ([7, 330], [1, 200])):
        problem = make_problem(
            seq_lens,
            query_lens,
            num_heads=12,
            num_kv_heads=4,
            head_dim=64,
            block_size=block_size,
            dtype=dtype,
            seed=block_size,
        )
        check(problem, attend(native_cpu_kernels, problem))
        check(problem, attend(native_cpu_kernels, problem, 37), 37)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_kernel_takes_head_sizes_the_avx512_kernel_does_not(native_cpu_kernels, isa, dtype):
    # float16, head_dim 17 and 48 (a multiple of 16, not of 32: bf16 pairs need 32) fall back in turn
    for head_dim in (17, 48):
        problem = make_problem(
            *MIXED, num_heads=6, num_kv_heads=2, head_dim=head_dim, block_size=16, dtype=dtype, seed=head_dim
        )
        check(problem, attend(native_cpu_kernels, problem))


def test_the_detected_isa_is_the_cpus(native_cpu_kernels):
    with open("/proc/cpuinfo") as cpuinfo:
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= set(flags)
    expected = (
        "avx512_bf16"
        if avx512 and "avx512_bf16" in flags
        else "avx512"
        if avx512
        else "avx2"
        if {"avx2", "fma"} <= set(flags)
        else "portable"
    )
    assert native_cpu_kernels.attention_isa("auto") == expected
    assert native_cpu_kernels.attention_isa("") == expected


def test_an_unknown_or_missing_isa_is_refused_by_name(native_cpu_kernels):
    with pytest.raises(RuntimeError, match="unknown CPU attention ISA 'sse9': use auto, portable, avx2"):
        native_cpu_kernels.attention_isa("sse9")
    best = native_cpu_kernels.attention_isa("")
    if best != "avx512_bf16":
        higher = native_cpu_kernels.ISA_LEVELS[native_cpu_kernels.ISA_LEVELS.index(best) + 1]
        with pytest.raises(RuntimeError, match=f"this CPU lacks {higher}"):
            native_cpu_kernels.attention_isa(higher)
    assert native_cpu_kernels.attention_isa("") == best


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32])
def test_every_kernel_equals_the_reference_on_the_tiny_shapes_across_spans(native_cpu_kernels, isa, dtype, block_size):
    # 8 query heads over 4 KV heads, head_dim 32 (the tiny bench model). The AVX-512 kernel folds the
    # softmax once per span of 128 keys, walking every KV head per chunk for a few rows (decodes) and
    # one KV head at a time for many (a prefill tile): decodes whose context ends on, just past and
    # well past a span's end, and a prefill chunk of 150 tokens after 140 cached; with windows that
    # start mid-span and mid-block, and one so short that a tile's late rows see none of a span's keys
    seq_lens, query_lens = [300, 128, 129, 257, 40, 290], [1, 1, 1, 1, 1, 150]
    problem = make_problem(
        seq_lens,
        query_lens,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        block_size=block_size,
        dtype=dtype,
        seed=block_size + 1,
    )
    for window in (None, 5, 37, 131):
        check(problem, attend(native_cpu_kernels, problem, window), window)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32])
def test_every_kernel_equals_the_reference_with_one_to_three_rows_per_kv_head(
    native_cpu_kernels, isa, dtype, block_size
):
    # Rows per KV head = query tokens x group: 1 to 3 is the AVX-512 kernel's few-rows walk (every KV
    # head per chunk, the next chunk's keys and values asked for ahead); head_dim 32, 64, 96 and 128
    # take its value passes of 64, 32 and 16 dims in every combination. Contexts end mid-block and
    # past a span of 128 keys; a window starts mid-span. NaN fills every slot no sequence owns.
    for head_dim in (32, 64, 96, 128):
        for group, query_lens in ((1, [1, 2, 3, 1]), (2, [1, 1, 1, 1]), (3, [1, 1, 1, 1])):
            problem = make_problem(
                [151, 7, 200, 33],
                query_lens,
                num_heads=2 * group,
                num_kv_heads=2,
                head_dim=head_dim,
                block_size=block_size,
                dtype=dtype,
                seed=head_dim + group,
            )
            for window in (None, 20):
                check(problem, attend(native_cpu_kernels, problem, window), window)
