"""Plain torch references of the paged KV-cache ops: the oracles every kernel is tested against.

Written to be obviously correct, not fast (the CPU engine runs
`pagedinfer.kernels.cpu`, CUDA runs the Triton kernels). Layout of
`docs/design.md`: per layer a `[num_blocks, block_size, num_kv_heads, head_dim]`
key and value cache.

`paged_attention` works one sequence at a time: it reads the sequence's
blocks from its row of `block_tables`, keeps its first `seq_len` positions
(so no slot past the end, garbage or NaN, is ever read), repeats K/V per query
head (`repeat_kv` order: query head h uses KV head `h // group`), and computes
softmax(q k^T * scale + mask) v in float32 with an explicit mask: key position
k is visible from query position p iff `k <= p` and, with a sliding window W,
`k > p - W`.
"""

from __future__ import annotations

import torch

from pagedinfer.kernels.metadata import AttentionMetadata


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attention of the packed queries `[num_tokens, num_heads, head_dim]` over the paged K/V.

    Returns `[num_tokens, num_heads, value_dim]` in the query's dtype, computed in float32.
    """
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[2]
    block_size = key_cache.shape[1]
    outputs = []
    start = 0
    for i, (seq_len, query_len) in enumerate(zip(metadata.seq_lens_cpu, metadata.query_lens_cpu)):
        blocks = metadata.block_tables[i, : -(-seq_len // block_size)].long()
        k = key_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(num_heads // num_kv_heads, dim=1)
        v = value_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(num_heads // num_kv_heads, dim=1)
        q = query[start : start + query_len].float()
        query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)[:, None]
        key_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = key_pos <= query_pos
        if sliding_window is not None:
            visible &= key_pos > query_pos - sliding_window
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        outputs.append(torch.einsum("hqk,khd->qhd", probs, v))
        start += query_len
    if not outputs:
        return query.new_empty(0, num_heads, value_cache.shape[3])
    return torch.cat(outputs).to(query.dtype)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter `key`/`value` `[num_tokens, num_kv_heads, head_dim]` into the caches at `slot_mapping`.

    A slot of -1 marks a padding token: nothing is written for it.
    """
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key[keep].to(key_cache.dtype))
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value[keep].to(value_cache.dtype))


def check_block_mapping(block_mapping: torch.Tensor, num_src_blocks: int, num_dst_blocks: int, disjoint: bool) -> None:
    """A `[n, 2]` int64 mapping of `(src, dst)` block ids; ValueError naming what is wrong.

    Destinations must be distinct (and, with `disjoint`, never also a source:
    copies within one cache run in parallel). Ids are range-checked only when
    the mapping is on the host: checking a device tensor would stall the GPU.
    """
    if block_mapping.dtype != torch.int64 or block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(
            f"block_mapping must be an int64 [n, 2] tensor of (src, dst) block ids, "
            f"got {block_mapping.dtype} {tuple(block_mapping.shape)}"
        )
    if block_mapping.device.type != "cpu" or block_mapping.numel() == 0:
        return
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    if int(src.min()) < 0 or int(src.max()) >= num_src_blocks:
        raise ValueError(f"block_mapping: source block ids must be in [0, {num_src_blocks})")
    if int(dst.min()) < 0 or int(dst.max()) >= num_dst_blocks:
        raise ValueError(f"block_mapping: destination block ids must be in [0, {num_dst_blocks})")
    if dst.unique().numel() != dst.numel():
        raise ValueError("block_mapping: destination block ids must be distinct")
    if disjoint and torch.isin(dst, src).any():
        raise ValueError("block_mapping: a destination block is also a source block")


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy block `src` to block `dst` for each row `(src, dst)` of `block_mapping`, in every layer.

    Copy-on-write hands out fresh blocks: destinations are distinct and never sources.
    """
    if not key_caches:
        raise ValueError("key_caches is empty")
    check_block_mapping(block_mapping, key_caches[0].shape[0], key_caches[0].shape[0], disjoint=True)
    if block_mapping.numel() == 0:
        return
    src = block_mapping[:, 0].to(key_caches[0].device)
    dst = block_mapping[:, 1].to(key_caches[0].device)
    for cache in (*key_caches, *value_caches):
        cache.index_copy_(0, dst, cache.index_select(0, src))


def swap_blocks(
    src_cache: torch.Tensor, dst_cache: torch.Tensor, block_mapping: torch.Tensor, block_dim: int = 0
) -> None:
    """Copy blocks between two caches (device <-> pinned host), `(src, dst)` rows of `block_mapping`.

    The blocks are gathered into one contiguous buffer on the source's device,
    moved in one transfer, and scattered on the destination's device.
    `block_dim` names the block axis (0 for a per-layer cache, 2 for the whole
    `[2, num_layers, num_blocks, ...]` allocation: all layers in one transfer).
    """
    check_block_mapping(block_mapping, src_cache.shape[block_dim], dst_cache.shape[block_dim], disjoint=False)
    if block_mapping.numel() == 0:
        return
    src = block_mapping[:, 0].to(src_cache.device)
    dst = block_mapping[:, 1].to(dst_cache.device)
    staged = src_cache.index_select(block_dim, src)
    dst_cache.index_copy_(block_dim, dst, staged.to(dst_cache.device))
