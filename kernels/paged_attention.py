"""Launchers of the paged attention kernels: decode, prefill, and the mixed batch of a step.

`paged_attention_triton` runs the decode launcher on the step's first
`num_decode_seqs` sequences and the prefill launcher on the rest, both
writing into one output. The kernels are in `attention_kernels.py`, the
torch reference they are tested against in `reference.py`.

Tile shapes (defaults, overridable for tuning):

- decode: one query token, `BLOCK_M = max(16, group)` rows (`tl.dot` needs
  16), `TILE_N = 64` keys per iteration (32 for head_dim 256);
- prefill: `BLOCK_M = 128` rows (32 for head_dim 256) = `BLOCK_Q` query tokens
  x the group's heads, same key tiles, 8 warps and 3 stages (16-bit caches; 2
  for float32; 4 warps and 2 stages for head_dim 256): the shape of Triton's
  flash-attention on Hopper (it was 64 rows, 4 warps, 2 stages: 0.52x and 0.54x
  of torch SDPA at 1 x 4096 and 8 x 1024 on an H200, issue 29; the new shape is
  not measured yet).

In the kernel, the key tiles wholly before a program's first query position
run without the causal mask and the key bounds (every row sees all of them),
and a sequence's last query tiles are launched first.

Split-K for decodes (`choose_num_splits`): a decode batch of n sequences
has only `n * num_kv_heads` programs; when that is too few to occupy the GPU
(fewer than `PROGRAMS_PER_SM` per multiprocessor) and contexts are long, each
program's keys are split over several programs whose partial results a
second kernel merges. Splits never go below `MIN_TOKENS_PER_SPLIT` keys or
above `MAX_SPLITS`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from pagedinfer.kernels.attention_kernels import merge_splits_kernel, paged_attention_kernel
from pagedinfer.kernels.metadata import AttentionMetadata

LOG2_E = 1.4426950408889634
PROGRAMS_PER_SM = 4
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64
CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_visible_keys: int, num_sms: int) -> int:
    """Key splits per decode program: enough programs to fill the GPU, never tiny splits.

    `max_visible_keys` is the most keys one program reads: the longest
    context, or the sliding window when that is shorter (a split past the
    window would be launched and merged for nothing).
    """
    programs = num_seqs * num_kv_heads
    wanted = math.ceil(PROGRAMS_PER_SM * num_sms / max(programs, 1))
    return max(1, min(wanted, MAX_SPLITS, max_visible_keys // MIN_TOKENS_PER_SPLIT))


def decode_visible_keys(metadata: AttentionMetadata, sliding_window: int | None) -> int:
    """The most keys any decode of the step attends to (0 without decodes)."""
    longest = max(metadata.seq_lens_cpu[: metadata.num_decode_seqs], default=0)
    return longest if sliding_window is None else min(longest, sliding_window)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def check_attention_inputs(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, metadata: AttentionMetadata
) -> None:
    """Shapes, dtypes, strides and devices the kernels rely on; ValueError naming the argument."""
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, num_heads, head_dim], got shape {tuple(query.shape)}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            "key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_dim], got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    if key_cache.stride() != value_cache.stride():
        raise ValueError(f"key_cache and value_cache strides differ: {key_cache.stride()} vs {value_cache.stride()}")
    if key_cache.dtype not in CACHE_DTYPES or value_cache.dtype != key_cache.dtype:
        raise ValueError(
            f"key_cache/value_cache dtype must be one of {CACHE_DTYPES} and equal, "
            f"got {key_cache.dtype} and {value_cache.dtype}"
        )
    if query.dtype not in CACHE_DTYPES:
        raise ValueError(f"query dtype must be one of {CACHE_DTYPES}, got {query.dtype}")
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_dim or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim: query has {head_dim}, cache has {key_cache.shape[3]} (at most {MAX_HEAD_DIM})")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads = {num_heads} must be a multiple of num_kv_heads = {num_kv_heads}")
    if query.stride(-1) != 1 or key_cache.stride(-1) != 1:
        raise ValueError("query and the caches must have a unit stride along head_dim")
    if query.shape[0] != metadata.num_tokens:
        raise ValueError(f"query has {query.shape[0]} tokens, metadata has {metadata.num_tokens}")
    devices = {
        t.device
        for t in (query, key_cache, value_cache, metadata.block_tables, metadata.seq_lens, metadata.query_start_loc)
    }
    if len(devices) != 1:
        raise ValueError(f"query, caches and metadata tensors must share one device, got {sorted(map(str, devices))}")
    if metadata.block_tables.shape[1] and metadata.block_tables.stride(1) != 1:
        raise ValueError("metadata.block_tables must have a unit stride along its rows")


@dataclass(frozen=True)
class TileShape:
    block_q: int  # query tokens per program
    block_m: int  # rows per program: block_q x the group's heads (padded to a power of two), >= 16
    tile_n: int  # key positions per loop iteration


def decode_tile_shape(num_heads: int, num_kv_heads: int, head_dim: int, tile_n: int | None = None) -> TileShape:
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    return TileShape(block_q=1, block_m=max(16, group_pad), tile_n=tile_n or (64 if head_dim <= 128 else 32))


def prefill_tile_shape(
    num_heads: int, num_kv_heads: int, head_dim: int, block_m: int | None = None, tile_n: int | None = None
) -> TileShape:
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    block_m = block_m or (128 if head_dim <= 128 else 32)
    block_q = max(1, block_m // group_pad)
    return TileShape(
        block_q=block_q, block_m=max(block_m, group_pad * block_q, 16), tile_n=tile_n or (64 if head_dim <= 128 else 32)
    )


def prefill_warps_stages(head_dim: int, cache_dtype: torch.dtype) -> tuple[int, int]:
    """`num_warps`, `num_stages` of the prefill launch: 8 warps over the 128-row tiles of head_dim <= 128 and a
    third stage for 16-bit caches (Triton's Hopper flash-attention configuration); 4 and 2 otherwise."""
    if head_dim > 128:
        return 4, 2
    return 8, (2 if cache_dtype == torch.float32 else 3)


def kernel_constants(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    cache_dtype: torch.dtype,
    tiles: TileShape,
    has_window: bool,
    use_splits: bool,
) -> dict:
    """The compile-time constants of `paged_attention_kernel` for one launch."""
    group = num_heads // num_kv_heads
    return dict(
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        BLOCK_Q=tiles.block_q,
        BLOCK_M=tiles.block_m,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        TILE_N=tiles.tile_n,
        HAS_WINDOW=has_window,
        USE_SPLITS=use_splits,
        DOT_PRECISION="ieee" if cache_dtype == torch.float32 else None,
    )


def _launch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    out: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    first_seq: int,
    num_seqs: int,
    tiles: TileShape,
    num_splits: int,
    num_q_tiles: int,
    num_warps: int,
    num_stages: int,
) -> None:
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    use_splits = num_splits > 1
    if use_splits:
        partial_out = torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        partial_max = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=query.device)
        partial_sum = torch.empty_like(partial_max)
    else:
        partial_out = partial_max = partial_sum = out
    grid = (num_seqs * num_q_tiles, num_kv_heads, num_splits)
    paged_attention_kernel[grid](
        out,
        partial_out,
        partial_max,
        partial_sum,
        query,
        key_cache,
        value_cache,
        metadata.block_tables,
        metadata.seq_lens,
        metadata.query_start_loc,
        scale * LOG2_E,
        sliding_window or 0,
        first_seq,
        num_q_tiles,
        num_splits,
        num_heads,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        metadata.block_tables.stride(0),
        **kernel_constants(
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            key_cache.dtype,
            tiles,
            sliding_window is not None,
            use_splits,
        ),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if use_splits:
        merge_splits_kernel[(num_tokens, num_heads)](
            out,
            partial_out,
            partial_max,
            partial_sum,
            num_splits,
            num_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            BLOCK_S=triton.next_power_of_2(num_splits),
        )


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    tile_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of the step's decodes (its first `num_decode_seqs` sequences, one query token each).

    `query` may hold the whole step; rows past the decodes are left untouched in `out`.
    """
    check_attention_inputs(query, key_cache, value_cache, metadata)
    out = torch.empty_like(query) if out is None else out
    num_seqs = metadata.num_decode_seqs
    if num_seqs == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs, key_cache.shape[2], decode_visible_keys(metadata, sliding_window), _num_sms(query.device)
        )
    tiles = decode_tile_shape(query.shape[1], key_cache.shape[2], query.shape[2], tile_n)
    _launch(
        query[:num_seqs],
        key_cache,
        value_cache,
        metadata,
        out,
        scale,
        sliding_window,
        first_seq=0,
        num_seqs=num_seqs,
        tiles=tiles,
        num_splits=num_splits,
        num_q_tiles=1,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Attention of the step's prefill chunks (sequences `num_decode_seqs` onwards), causal over cache + chunk.

    Rows of the decodes are left untouched in `out`.
    """
    check_attention_inputs(query, key_cache, value_cache, metadata)
    out = torch.empty_like(query) if out is None else out
    first_seq = metadata.num_decode_seqs
    num_seqs = metadata.num_seqs - first_seq
    if num_seqs == 0:
        return out
    tiles = prefill_tile_shape(query.shape[1], key_cache.shape[2], query.shape[2], block_m, tile_n)
    default_warps, default_stages = prefill_warps_stages(query.shape[2], key_cache.dtype)
    num_warps, num_stages = num_warps or default_warps, num_stages or default_stages
    num_q_tiles = triton.cdiv(max(metadata.query_lens_cpu[first_seq:]), tiles.block_q)
    _launch(
        query,
        key_cache,
        value_cache,
        metadata,
        out,
        scale,
        sliding_window,
        first_seq=first_seq,
        num_seqs=num_seqs,
        tiles=tiles,
        num_splits=1,
        num_q_tiles=num_q_tiles,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def paged_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The step's attention: decode kernel for the decodes, prefill kernel for the rest, one output."""
    out = torch.empty_like(query)
    decode_attention(query, key_cache, value_cache, metadata, scale, sliding_window, out)
    prefill_attention(query, key_cache, value_cache, metadata, scale, sliding_window, out)
    return out
