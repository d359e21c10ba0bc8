"""Triton block copies: copy-on-write `copy_blocks` and host <-> device `swap_blocks`.

Both rest on one kernel that copies whole cache blocks: program
`(pair, cache, chunk)` copies `CHUNK` elements of block `src_ids[pair]` of
cache `cache` to block `dst_ids[pair]` of the destination. A "cache" here is
one of several equally shaped tensors laid out at a constant distance in
memory - the per-layer key and value views of the engine's single
`[2, num_layers, num_blocks, ...]` allocation - so every layer is copied by
one launch. Caches that are not evenly spaced are copied one launch each.

`swap_blocks` between a GPU and host memory cannot run a kernel on the host
side: the blocks are gathered by the kernel into a contiguous device buffer,
moved in one transfer, and scattered on the host with `index_copy_` (and the
reverse for swap-in). Between two tensors of one device it is a single
kernel copy. The torch references are `reference.copy_blocks/swap_blocks`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedinfer.kernels.reference import check_block_mapping

CHUNK = 1024


@triton.jit
def copy_blocks_kernel(
    src_ptr,  # first source cache
    dst_ptr,  # first destination cache
    src_ids_ptr,  # int64 [num_pairs]: source block of each pair
    dst_ids_ptr,  # int64 [num_pairs]: destination block of each pair
    block_numel,  # elements in one block (contiguous)
    src_cache_stride,  # elements between consecutive source caches
    dst_cache_stride,  # elements between consecutive destination caches
    src_block_stride,  # elements between consecutive source blocks
    dst_block_stride,  # elements between consecutive destination blocks
    CHUNK: tl.constexpr,  # elements per program
):
    pair = tl.program_id(0)
    cache = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    src_block = tl.load(src_ids_ptr + pair)
    dst_block = tl.load(dst_ids_ptr + pair)
    data = tl.load(src_ptr + cache * src_cache_stride + src_block * src_block_stride + offs, mask=mask)
    tl.store(dst_ptr + cache * dst_cache_stride + dst_block * dst_block_stride + offs, data, mask=mask)


def _cache_spacing(caches: list[torch.Tensor]) -> int | None:
    """Elements between consecutive caches if they are evenly spaced in memory, else None."""
    if len(caches) == 1:
        return 0
    step_bytes = caches[1].data_ptr() - caches[0].data_ptr()
    element_size = caches[0].element_size()
    if step_bytes <= 0 or step_bytes % element_size:
        return None
    if any(b.data_ptr() - a.data_ptr() != step_bytes for a, b in zip(caches, caches[1:])):
        return None
    return step_bytes // element_size


def _copy(
    src_caches: list[torch.Tensor], dst_caches: list[torch.Tensor], src_ids: torch.Tensor, dst_ids: torch.Tensor
) -> None:
    """Copy block src_ids[i] -> dst_ids[i] of src_caches[c] -> dst_caches[c] (each [num_blocks, ...])."""
    block_numel = src_caches[0][0].numel()
    num_pairs = src_ids.shape[0]
    if num_pairs == 0 or block_numel == 0:
        return
    src_spacing, dst_spacing = _cache_spacing(src_caches), _cache_spacing(dst_caches)
    if src_spacing is None or dst_spacing is None:
        for src, dst in zip(src_caches, dst_caches):
            _copy([src], [dst], src_ids, dst_ids)
        return
    grid = (num_pairs, len(src_caches), triton.cdiv(block_numel, CHUNK))
    copy_blocks_kernel[grid](
        src_caches[0],
        dst_caches[0],
        src_ids,
        dst_ids,
        block_numel,
        src_spacing,
        dst_spacing,
        src_caches[0].stride(0),
        dst_caches[0].stride(0),
        CHUNK=CHUNK,
    )


def _check_caches(caches: list[torch.Tensor], name: str) -> None:
    first = caches[0]
    for cache in caches:
        if cache.shape != first.shape or cache.dtype != first.dtype or cache.device != first.device:
            raise ValueError(f"{name}: every cache must share the shape, dtype and device of the first")
        if not cache.is_contiguous():
            raise ValueError(f"{name}: caches must be contiguous")


def copy_blocks_triton(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    """Copy-on-write in every layer: block src -> dst for each `(src, dst)` row, one launch when possible."""
    caches = [*key_caches, *value_caches]
    if not caches:
        raise ValueError("key_caches and value_caches are empty")
    _check_caches(caches, "key_caches/value_caches")
    check_block_mapping(block_mapping, caches[0].shape[0], caches[0].shape[0], disjoint=True)
    mapping = block_mapping.to(caches[0].device)
    _copy(caches, caches, mapping[:, 0].contiguous(), mapping[:, 1].contiguous())


def _as_caches(cache: torch.Tensor, block_dim: int, name: str) -> list[torch.Tensor]:
    """The tensor as a list of `[num_blocks, ...]` caches: one per index of the dimensions before block_dim."""
    if not 0 <= block_dim < cache.dim():
        raise ValueError(f"block_dim = {block_dim} is out of range for {name} of {cache.dim()} dimensions")
    if not cache.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return list(cache.reshape(-1, *cache.shape[block_dim:]).unbind(0))


def swap_blocks_triton(
    src_cache: torch.Tensor, dst_cache: torch.Tensor, block_mapping: torch.Tensor, block_dim: int = 0
) -> None:
    """Copy blocks `(src, dst)` between caches, possibly across devices (device <-> pinned host)."""
    if src_cache.dtype != dst_cache.dtype:
        raise ValueError(f"src_cache and dst_cache dtypes differ: {src_cache.dtype} vs {dst_cache.dtype}")
    src_caches = _as_caches(src_cache, block_dim, "src_cache")
    dst_caches = _as_caches(dst_cache, block_dim, "dst_cache")
    if len(src_caches) != len(dst_caches) or src_caches[0][0].shape != dst_caches[0][0].shape:
        raise ValueError(
            f"src_cache {tuple(src_cache.shape)} and dst_cache {tuple(dst_cache.shape)} differ "
            f"outside the block dimension {block_dim}"
        )
    check_block_mapping(block_mapping, src_caches[0].shape[0], dst_caches[0].shape[0], disjoint=False)
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    src_ids = block_mapping[:, 0].contiguous()
    dst_ids = block_mapping[:, 1].contiguous()
    if src_cache.device == dst_cache.device:
        _copy(src_caches, dst_caches, src_ids.to(src_cache.device), dst_ids.to(src_cache.device))
        return
    block_shape = src_caches[0].shape[1:]
    if src_cache.device.type == "cpu":
        staged = src_cache.reshape(len(src_caches), -1, *block_shape).index_select(1, src_ids.cpu())
        staged = staged.to(dst_cache.device)
        order = torch.arange(num_pairs, device=dst_cache.device)
        _copy(list(staged.unbind(0)), dst_caches, order, dst_ids.to(dst_cache.device))
        return
    staged = torch.empty(len(src_caches), num_pairs, *block_shape, dtype=src_cache.dtype, device=src_cache.device)
    order = torch.arange(num_pairs, device=src_cache.device)
    _copy(src_caches, list(staged.unbind(0)), src_ids.to(src_cache.device), order)
    host = dst_cache.reshape(len(dst_caches), -1, *block_shape)
    host.index_copy_(1, dst_ids.to(dst_cache.device), staged.to(dst_cache.device))
