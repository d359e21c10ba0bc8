"""The CPU attention ops as torch custom ops, and the entry points that pick native or torch.

Two ops in the `pagedinfer` namespace, their schemas and fake (shape-only)
kernels defined here so `torch.compile` can trace a forward that calls them;
their CPU kernels come from `csrc/paged_attention.cpp`, registered when
`build.load()` loads the library (on first CPU use, never at import):

- `torch.ops.pagedinfer.cpu_paged_attention(query, key_cache, value_cache,
  block_tables, seq_lens, query_start_loc, scale, sliding_window)` -> out
  `[num_tokens, num_heads, value_dim]` in the query's dtype;
- `torch.ops.pagedinfer.cpu_write_kv(key, value, key_cache, value_cache,
  slot_mapping)`, mutating both caches.

A third, `cpu_attention_isa(str) -> str` (defined in C++: it takes no tensor),
reads or forces the attention kernel the library runs (`attention_isa`).

`paged_attention` and `write_kv` below are what `dispatch.py` calls for CPU
tensors: the native op when the library loads and the dtypes are ones it
handles (float32, bfloat16, float16, query and caches alike), else the
vectorised torch path (`torch_attention.py`, `reference.write_kv`). `native_available`
is evaluated once by `torch.compile` (a constant), so a traced forward holds
the native op and no graph break.
"""

from __future__ import annotations

import torch

from pagedinfer.kernels import reference
from pagedinfer.kernels.cpu import build, torch_attention
from pagedinfer.kernels.metadata import AttentionMetadata

NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ISA_LEVELS = ("portable", "avx2", "avx512", "avx512_bf16")  # csrc/isa.h's levels, each needing those before it

_LIBRARY = torch.library.Library("pagedinfer", "FRAGMENT")
_LIBRARY.define(
    "cpu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, "
    "Tensor seq_lens, Tensor query_start_loc, float scale, int? sliding_window) -> Tensor"
)
_LIBRARY.define(
    "cpu_write_kv(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping) -> ()"
)


@torch.library.register_fake("pagedinfer::cpu_paged_attention", lib=_LIBRARY)
def _paged_attention_fake(
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window
):
    return query.new_empty(query.shape[0], query.shape[1], value_cache.shape[3])


@torch.library.register_fake("pagedinfer::cpu_write_kv", lib=_LIBRARY)
def _write_kv_fake(key, value, key_cache, value_cache, slot_mapping):
    return None


@torch.compiler.assume_constant_result
def native_available() -> bool:
    """Whether the native kernels are loaded (building them on the first call of the process)."""
    return build.load()


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Paged attention over CPU tensors: the native kernel, or the torch path where it cannot run."""
    if (
        query.dtype in NATIVE_DTYPES
        and key_cache.dtype == query.dtype == value_cache.dtype
        and key_cache.is_contiguous()
        and value_cache.is_contiguous()
        and native_available()
    ):
        return torch.ops.pagedinfer.cpu_paged_attention(
            query.contiguous(),
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.seq_lens,
            metadata.query_start_loc,
            scale,
            sliding_window,
        )
    return torch_attention.paged_attention(query, key_cache, value_cache, metadata, scale, sliding_window)


def attention_isa(request: str = "") -> str:
    """The native attention's kernel: "avx512_bf16", "avx512", "avx2" or "portable" (see `csrc/isa.h`).

    An empty request reads it; "auto" goes back to the best this CPU has; a level name forces that
    kernel for the process (tests and `bench/cpu_attention.py` compare them), a RuntimeError if the
    CPU lacks it. The native library must be loaded (`native_available()`).
    """
    return torch.ops.pagedinfer.cpu_attention_isa(request)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's K/V into CPU caches at `slot_mapping` (-1 skipped), natively when loaded."""
    if (
        key_cache.dtype in NATIVE_DTYPES
        and key_cache.is_contiguous()
        and value_cache.is_contiguous()
        and native_available()
    ):
        if key.stride(-1) != 1:
            key = key.contiguous()
        if value.stride(-1) != 1:
            value = value.contiguous()
        if key.dtype != key_cache.dtype:  # the engine's steps already match: no conversion per layer
            key = key.to(key_cache.dtype)
        if value.dtype != value_cache.dtype:
            value = value.to(value_cache.dtype)
        torch.ops.pagedinfer.cpu_write_kv(key, value, key_cache, value_cache, slot_mapping)
        return
    reference.write_kv(key, value, key_cache, value_cache, slot_mapping)
