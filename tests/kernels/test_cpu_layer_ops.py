"""The native CPU layer ops (RMSNorm, residual add + RMSNorm, rotary, SiLU-and-multiply) equal their torch references.

Every instruction set this CPU has (the `isa` fixture), float32 and bfloat16, on the tiny and 125M
bench models' shapes and on sizes the vector loops must finish with a scalar tail (67 columns,
head_dim 24 and 40: halves of 12 and 20). Inputs are strided views of wider tensors (as the fused
GEMMs' outputs are), so a kernel that assumed contiguous rows would read the wrong columns.
"""

from __future__ import annotations

import pytest
import torch

from pagedinfer.kernels.cpu import layer_ops
from pagedinfer.kernels.cpu import torch_layer_ops as reference

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # fp32 sum order; bf16 one rounding apart at most
DTYPES = [torch.float32, torch.bfloat16]
HIDDEN_SIZES = [64, 256, 768, 67]  # tiny test model, tiny bench, 125M, a scalar tail on every vector width
# (query heads, key heads, head_dim, norms): tiny test llama, tiny bench, 125M, tiny Qwen3 (q/k norms), tails
ROTARY_SHAPES = [(4, 2, 16, False), (8, 4, 32, False), (12, 4, 64, False), (4, 2, 24, True), (3, 1, 40, True)]


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


def rows(num_rows: int, width: int, dtype: torch.dtype, seed: int, pad: int = 5) -> torch.Tensor:
    """A [num_rows, width] view of a wider tensor (row stride width + pad)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, width + pad, generator=generator).to(dtype)[:, :width]


def cos_sin(num_positions: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = torch.arange(num_positions, dtype=torch.float)[:, None] * inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_equals_the_reference(native_cpu_kernels, isa, dtype):
    for hidden in HIDDEN_SIZES:
        x, weight = rows(7, hidden, dtype, hidden), rows(1, hidden, dtype, -hidden, pad=0)[0].contiguous()
        close(layer_ops.rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_updates_the_residual_and_normalises_it_in_place(native_cpu_kernels, isa, dtype):
    for hidden in HIDDEN_SIZES:
        x, residual = rows(9, hidden, dtype, hidden), rows(9, hidden, dtype, 2 * hidden, pad=3)
        weight = rows(1, hidden, dtype, -hidden, pad=0)[0].contiguous()
        normed, summed = reference.fused_add_rms_norm(x, residual, weight, 1e-5)
        layer_ops.fused_add_rms_norm(x, residual, weight, 1e-5)
        close(residual, summed)
        close(x, normed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_rotates_query_and_key_heads_in_place_and_leaves_values(native_cpu_kernels, isa, dtype):
    for query_heads, key_heads, head_dim, norms in ROTARY_SHAPES:
        width = (query_heads + 2 * key_heads) * head_dim  # q | k | v, as one qkv GEMM writes them
        qkv = rows(11, width, dtype, width)
        cache = cos_sin(300, head_dim)
        positions = torch.tensor([0, 1, 2, 17, 299, 5, 6, 130, 131, 8, 0])
        q_norm = rows(1, head_dim, dtype, 1, pad=0)[0].contiguous() if norms else None
        k_norm = rows(1, head_dim, dtype, 2, pad=0)[0].contiguous() if norms else None
        expected = reference.rotary_embedding(positions, qkv, cache, query_heads, key_heads, head_dim, q_norm, k_norm)
        values = qkv[:, (query_heads + key_heads) * head_dim :].clone()
        layer_ops.rotary_embedding(positions, qkv, cache, query_heads, key_heads, head_dim, q_norm, k_norm)
        close(qkv, expected)
        assert torch.equal(qkv[:, (query_heads + key_heads) * head_dim :], values)


def test_rotary_equals_transformers_rope_in_float32(native_cpu_kernels):
    """The reference is transformers' apply_rotary_pos_emb on the cos/sin its rotary module computes."""
    from transformers.models.llama import modeling_llama

    from pagedinfer.engine.tiny_model import tiny_config

    rotary = modeling_llama.LlamaRotaryEmbedding(tiny_config("llama"))
    head_dim = 16
    positions = torch.tensor([3, 0, 900, 41])
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None])
    q, k = rows(4, 4 * head_dim, torch.float32, 1), rows(4, 2 * head_dim, torch.float32, 2)
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(
        q.reshape(1, 4, 4, head_dim).transpose(1, 2), k.reshape(1, 4, 2, head_dim).transpose(1, 2), cos, sin
    )
    qkv = torch.cat([q, k], dim=1)
    table = cos_sin(1024, head_dim)
    layer_ops.rotary_embedding(positions, qkv, table, 4, 2, head_dim)
    torch.testing.assert_close(qkv[:, :64], want_q.transpose(1, 2).reshape(4, 64), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qkv[:, 64:], want_k.transpose(1, 2).reshape(4, 32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_equals_the_reference(native_cpu_kernels, isa, dtype):
    for width in (128, 688, 2048, 37):  # tiny test model, tiny bench, 125M, a tail
        x = rows(6, 2 * width, dtype, width)
        x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # saturated gates: silu 0 and x, no NaN
        close(layer_ops.silu_and_mul(x), reference.silu_and_mul(x))


def test_bad_arguments_are_named(native_cpu_kernels):
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="weight has 7 elements, expected 8"):
        layer_ops.rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="float32 or bfloat16, got Half"):
        layer_ops.silu_and_mul(x.half())
    with pytest.raises(RuntimeError, match="input's last dimension .* must be even"):
        layer_ops.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(RuntimeError, match=r"positions\[1\] = 300 is out of the rotary cache's range \[0, 300\)"):
        layer_ops.rotary_embedding(torch.tensor([0, 300]), x, cos_sin(300, 4), 1, 1, 4)
    with pytest.raises(RuntimeError, match="residual .* and input .* differ"):
        layer_ops.fused_add_rms_norm(x, torch.randn(3, 8), torch.ones(8), 1e-6)


def test_a_compiled_graph_holds_the_ops_and_their_mutations(native_cpu_kernels):
    """The fake kernels and mutation annotations let torch.compile trace them (the --compile forward does)."""

    def block(x, residual, qkv, positions, cache, weight):
        layer_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
        layer_ops.rotary_embedding(positions, qkv, cache, 2, 1, 8)
        return layer_ops.silu_and_mul(layer_ops.rms_norm(x, weight, 1e-6)) + qkv[:, :8]

    args = (
        rows(3, 16, torch.float32, 1),
        rows(3, 16, torch.float32, 2),
        rows(3, 32, torch.float32, 3),
        torch.tensor([4, 0, 9]),
        cos_sin(10, 8),
        torch.rand(16),
    )
    eager_args = [a.clone() for a in args]
    want = block(*eager_args)
    got = torch.compile(block, backend="aot_eager", fullgraph=True)(*args)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for compiled, eager in zip(args[:3], eager_args[:3]):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
