"""The fused decoder's Triton layer kernels (interpreter) match their torch references: add + RMSNorm,
rotary fused with the paged KV write (padding rows write nothing), SiLU-and-multiply."""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels.rms_norm import rms_norm, rms_norm_reference
from pagedinfer.kernels.rotary_kv import rotary_write_kv, rotary_write_kv_reference
from pagedinfer.kernels.silu_mul import silu_mul, silu_mul_reference

# float32 up to rounding order; bfloat16 one rounding apart (ours rounds once, at the end)
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_with_and_without_the_residual_add(dtype, with_residual):
    tokens, hidden = 5, 72  # hidden not a power of two
    x, weight = randn(tokens, hidden, dtype=dtype, seed=1), randn(hidden, dtype=dtype, seed=2)
    residual = randn(tokens, hidden, dtype=dtype, seed=3) if with_residual else None
    want_out, want_residual = rms_norm_reference(x, weight, 1e-6, residual)
    got_out, got_residual = rms_norm(x, weight, 1e-6, residual.clone() if with_residual else None)
    torch.testing.assert_close(got_out, want_out, **TOLERANCE[dtype])
    torch.testing.assert_close(got_residual, want_residual, **TOLERANCE[dtype])
    if not with_residual:
        assert got_residual is x  # the first layer's input is the residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_q,num_kv,head_dim,qk_norm", [(4, 2, 16, False), (3, 1, 24, True), (6, 3, 10, False)])
def test_rotary_write_kv_rotates_in_place_and_writes_the_cache(dtype, num_q, num_kv, head_dim, qk_norm):
    tokens, block_size, num_blocks = 6, 4, 5
    width = (num_q + 2 * num_kv) * head_dim
    gen = torch.Generator().manual_seed(head_dim)
    qkv = randn(tokens, width + 8, dtype=dtype, seed=4)[:, :width]  # a strided view, as a GEMM output's split
    positions = torch.randint(0, 30, (tokens,), generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.arange(32).float()[:, None] * inv_freq
    cos_sin = torch.cat((angles.cos(), angles.sin()), -1)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[3] = -1  # a padding row
    norms = (randn(head_dim, dtype=dtype, seed=5), randn(head_dim, dtype=dtype, seed=6), 1e-6) if qk_norm else None
    caches = [torch.zeros(num_blocks, block_size, num_kv, head_dim, dtype=dtype) for _ in range(4)]
    want = qkv.clone()
    rotary_write_kv_reference(want, positions, cos_sin, caches[2], caches[3], slots, num_q, num_kv, head_dim, norms)
    got = qkv.clone()
    rotary_write_kv(got, positions, cos_sin, caches[0], caches[1], slots, num_q, num_kv, head_dim, norms)
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])
    torch.testing.assert_close(caches[0], caches[2], **TOLERANCE[dtype])
    assert torch.equal(caches[1], caches[3])  # values are copied, not computed
    written = caches[0].flatten(0, 1).abs().sum((-1, -2)) > 0
    assert int(written.sum()) == tokens - 1  # the padding row wrote nothing


def test_rotary_write_kv_names_a_bad_cos_sin():
    qkv = torch.zeros(2, 4 * 8)
    cache = torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match="cos_sin"):
        rotary_write_kv(
            qkv,
            torch.zeros(2, dtype=torch.long),
            torch.zeros(4, 6),
            cache,
            cache.clone(),
            torch.zeros(2, dtype=torch.long),
            2,
            1,
            8,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_over_column_blocks(dtype):
    x = randn(3, 2 * 50, dtype=dtype, seed=7)
    torch.testing.assert_close(silu_mul(x, block_n=16), silu_mul_reference(x), **TOLERANCE[dtype])
