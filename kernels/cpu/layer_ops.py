"""The decoder layer's small ops on CPU as torch custom ops: RMSNorm, residual add + RMSNorm, rotary, SiLU-and-multiply.

transformers runs each of these as several torch ops with temporaries
(RMSNorm: cast, pow, mean, rsqrt, two multiplies, cast back; rotary:
slices, cat, negation, four multiplies, two adds, for q and for k). Here each
is one native call (`csrc/layer_ops.cpp`) that reads its rows once, computes
in float32 and rounds once per element, in place where the input is dead
after, as vLLM's CPU backend does. Schemas and fake kernels are defined here,
so `torch.compile` traces a forward that calls them; the CPU kernels come with
the library `build.load()` builds (the same one as the attention's):

- `cpu_rms_norm(input, weight, eps)` -> new `[rows, hidden]`;
- `cpu_fused_add_rms_norm(input!, residual!, weight, eps)`: `s = residual + input`
  in float32, `residual = s` rounded to the dtype, `input = rms_norm(s) * weight`;
- `cpu_rotary_embedding(positions, qkv!, cos_sin_cache, num_query_heads,
  num_key_heads, head_dim, query_norm, key_norm, eps)`: in place on the
  query and key heads of each row of `qkv` (value columns untouched): an
  optional per-head RMSNorm (Qwen3's q_norm / k_norm), then rotate_half RoPE by
  the float32 `cos_sin_cache[position] = [cos | sin]`;
- `cpu_silu_and_mul(input)` -> `silu(input[:, :n]) * input[:, n:]`, `[rows, n]`.

Inputs are 2-d float32 or bfloat16 CPU tensors with a unit-stride last
dimension (row strides are free: views of a fused GEMM's output work);
weights are contiguous and of the input's dtype. The entry points below call
the ops directly: `available(dtype)` must have answered True first in the
process (it loads the library; `engine/cpu/fused_layers.py` checks it before
using them). `torch_layer_ops.py` holds
the torch references the tests compare with. The instruction set follows
`ops.attention_isa` (one override for every native kernel).
"""

from __future__ import annotations

import torch

from pagedinfer.kernels.cpu import ops

NATIVE_DTYPES = (torch.float32, torch.bfloat16)

_LIBRARY = torch.library.Library("pagedinfer", "FRAGMENT")
_LIBRARY.define("cpu_rms_norm(Tensor input, Tensor weight, float eps) -> Tensor")
_LIBRARY.define("cpu_fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps) -> ()")
_LIBRARY.define(
    "cpu_rotary_embedding(Tensor positions, Tensor(a!) qkv, Tensor cos_sin_cache, int num_query_heads, "
    "int num_key_heads, int head_dim, Tensor? query_norm, Tensor? key_norm, float eps) -> ()"
)
_LIBRARY.define("cpu_silu_and_mul(Tensor input) -> Tensor")


@torch.library.register_fake("pagedinfer::cpu_rms_norm", lib=_LIBRARY)
def _rms_norm_fake(input, weight, eps):
    return input.new_empty(input.shape)


@torch.library.register_fake("pagedinfer::cpu_fused_add_rms_norm", lib=_LIBRARY)
def _fused_add_rms_norm_fake(input, residual, weight, eps):
    return None


@torch.library.register_fake("pagedinfer::cpu_rotary_embedding", lib=_LIBRARY)
def _rotary_embedding_fake(
    positions, qkv, cos_sin_cache, num_query_heads, num_key_heads, head_dim, query_norm, key_norm, eps
):
    return None


@torch.library.register_fake("pagedinfer::cpu_silu_and_mul", lib=_LIBRARY)
def _silu_and_mul_fake(input):
    return input.new_empty(input.shape[0], input.shape[1] // 2)


def available(dtype: torch.dtype) -> bool:
    """Whether the native layer ops run for `dtype` (building the library on the process's first call)."""
    return dtype in NATIVE_DTYPES and ops.native_available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.ops.pagedinfer.cpu_rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    torch.ops.pagedinfer.cpu_fused_add_rms_norm(x, residual, weight, eps)


def rotary_embedding(
    positions: torch.Tensor,
    qkv: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_query_heads: int,
    num_key_heads: int,
    head_dim: int,
    query_norm: torch.Tensor | None = None,
    key_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    torch.ops.pagedinfer.cpu_rotary_embedding(
        positions, qkv, cos_sin_cache, num_query_heads, num_key_heads, head_dim, query_norm, key_norm, eps
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.pagedinfer.cpu_silu_and_mul(x)
