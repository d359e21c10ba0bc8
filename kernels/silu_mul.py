"""Triton SiLU-and-multiply of a gated MLP: `out = silu(gate) * up` from the gate_up GEMM's `[tokens, 2 * inter]`.

The left half of each row is the gate, the right half the up projection (the
order `fuse_projections` concatenates gate_proj and up_proj in). Computed in
float32, rounded once to the input's dtype. Grid: one program per (row, column
block of `BLOCK_N`). The torch reference is `silu_mul_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def silu_mul_kernel(
    x_ptr,  # [tokens, 2 * INTER]
    out_ptr,  # [tokens, INTER]
    stride_x,
    stride_o,
    INTER: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < INTER
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(x: torch.Tensor, block_n: int = 1024) -> torch.Tensor:
    """`silu(x[:, :inter]) * x[:, inter:]` for `x` `[tokens, 2 * inter]` (unit stride along columns)."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [tokens, 2 * inter] with a unit stride along columns, got {tuple(x.shape)}")
    inter = x.shape[1] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    block_n = min(block_n, triton.next_power_of_2(inter))
    if x.shape[0]:
        silu_mul_kernel[(x.shape[0], triton.cdiv(inter, block_n))](
            x, out, x.stride(0), out.stride(0), INTER=inter, BLOCK_N=block_n
        )
    return out


def silu_mul_reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
