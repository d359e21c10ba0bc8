"""Triton RMSNorm with the residual add fused in: one read of the rows, one write of each result.

`rms_norm(x, weight, eps, residual)` computes, per row of `[tokens, hidden]`:

- with a residual: `residual = x + residual` (rounded to the residual's dtype and
  written back in place, as transformers' decoder layers round the sum to the
  model dtype), then `out = weight * s / sqrt(mean(s^2) + eps)` of that sum `s`;
- without one (the first layer): `out` = the same norm of `x`, and `x` is the new residual.

The norm is computed in float32 from the (rounded) sum and rounded once to the
output dtype (transformers rounds the normalised row before the weight multiply
too: in float32 both are the same; in bfloat16 ours is as close to float32's or
closer). One program per row; `BLOCK_N` = the next power of two of `hidden`.
The torch reference is `rms_norm_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(
    x_ptr,  # [tokens, hidden]
    residual_ptr,  # [tokens, hidden], read and written in place (HAS_RESIDUAL only)
    weight_ptr,  # [hidden]
    out_ptr,  # [tokens, hidden]
    stride_x,
    stride_r,
    stride_o,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < HIDDEN
    s = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(residual_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * stride_r + cols, s, mask=mask)
    s = s.to(tl.float32)
    variance = tl.sum(s * s, 0) / HIDDEN
    normed = s * (1.0 / tl.sqrt(variance + eps))
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * weight).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed rows, the new residual) of `x` `[tokens, hidden]` (see the module docstring); `x` is not written."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [tokens, hidden] with a unit stride along hidden, got {tuple(x.shape)}")
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight must be [hidden = {x.shape[1]}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(
            f"residual must be {tuple(x.shape)} with a unit stride along hidden, got {tuple(residual.shape)}"
        )
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        has_residual = residual is not None
        block_n = triton.next_power_of_2(x.shape[1])
        rms_norm_kernel[(x.shape[0],)](
            x,
            residual if has_residual else x,
            weight,
            out,
            x.stride(0),
            residual.stride(0) if has_residual else 0,
            out.stride(0),
            eps,
            HIDDEN=x.shape[1],
            BLOCK_N=block_n,
            HAS_RESIDUAL=has_residual,
            num_warps=4 if block_n <= 2048 else 8,
        )
    return out, (residual if residual is not None else x)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `residual + hidden` then LlamaRMSNorm, as plain torch (out of place)."""
    summed = x if residual is None else (x.float() + residual.float()).to(residual.dtype)
    s = summed.float()
    normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype), summed
