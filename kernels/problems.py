"""Random paged-attention problems and a dense oracle (for tests and `bench/gpu_check.py`).

A problem is a step of the engine in miniature: sequences with a context
length and a number of new query tokens, their K/V already written into a
paged cache through shuffled, non-contiguous physical blocks. Every cache
slot that no sequence owns is filled with NaN, so a kernel that reads a
block or slot it should not read produces NaN instead of a plausible number.

The oracle, `dense_attention`, gathers each sequence's K/V in position order
and runs `torch.nn.functional.scaled_dot_product_attention` with an explicit
causal / sliding-window mask: an independent path from the paged kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedinfer.kernels.metadata import AttentionMetadata, build_attention_metadata


@dataclass(frozen=True)
class PagedProblem:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    metadata: AttentionMetadata
    block_tables: list[list[int]]
    scale: float


def shuffled_block_tables(
    seq_lens: list[int], block_size: int, generator: torch.Generator, num_spare_blocks: int = 3
) -> tuple[list[list[int]], int]:
    """Distinct physical blocks for each sequence, drawn from a shuffled pool; returns (tables, num_blocks)."""
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + num_spare_blocks
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    tables, start = [], 0
    for count in needed:
        tables.append(pool[start : start + count])
        start += count
    return tables, num_blocks


def make_problem(
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> PagedProblem:
    """A random step whose K/V (cached prefix and new chunk alike) are already in the paged cache."""
    generator = torch.Generator().manual_seed(seed)
    tables, num_blocks = shuffled_block_tables(seq_lens, block_size, generator)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    for seq_len, table in zip(seq_lens, tables):
        for position in range(0, seq_len, block_size):
            count = min(block_size, seq_len - position)
            block = table[position // block_size]
            key_cache[block, :count] = torch.randn(count, num_kv_heads, head_dim, generator=generator).to(dtype)
            value_cache[block, :count] = torch.randn(count, num_kv_heads, head_dim, generator=generator).to(dtype)
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=generator).to(dtype)
    metadata = build_attention_metadata(seq_lens, query_lens, tables, block_size, device=device)
    return PagedProblem(
        query=query.to(device),
        key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        metadata=metadata,
        block_tables=tables,
        scale=head_dim**-0.5,
    )


def gather_sequence(cache: torch.Tensor, table: list[int], seq_len: int) -> torch.Tensor:
    """A sequence's K or V in position order: `[seq_len, num_kv_heads, head_dim]`."""
    return cache[torch.tensor(table, device=cache.device)].flatten(0, 1)[:seq_len]


def dense_attention(problem: PagedProblem, sliding_window: int | None = None) -> torch.Tensor:
    """The oracle: per sequence, SDPA over its gathered K/V with an explicit mask; float32 out."""
    meta = problem.metadata
    num_heads = problem.query.shape[1]
    outputs = []
    start = 0
    for seq_len, query_len, table in zip(meta.seq_lens_cpu, meta.query_lens_cpu, problem.block_tables):
        group = num_heads // problem.key_cache.shape[2]
        k = gather_sequence(problem.key_cache, table, seq_len).float().repeat_interleave(group, dim=1)
        v = gather_sequence(problem.value_cache, table, seq_len).float().repeat_interleave(group, dim=1)
        q = problem.query[start : start + query_len].float()
        query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)[:, None]
        key_pos = torch.arange(seq_len, device=q.device)[None, :]
        mask = key_pos <= query_pos
        if sliding_window is not None:
            mask &= key_pos > query_pos - sliding_window
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=problem.scale
        )
        outputs.append(out.transpose(0, 1))
        start += query_len
    return torch.cat(outputs)
