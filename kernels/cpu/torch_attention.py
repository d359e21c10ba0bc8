"""Paged attention in vectorised torch: the CPU fallback when the native kernel cannot be built.

`ops.paged_attention` runs this when `build.load()` fails (no compiler or
ninja) or for a dtype the native kernel lacks; `PAGEDINFER_ATTENTION=torch`
forces it. Tests compare it, like every kernel, with the plain per-sequence
`pagedinfer.kernels.reference`. Layout of `docs/design.md`: per layer a
`[num_blocks, block_size, num_kv_heads, head_dim]` key and value cache.

One pass per group of sequences, never per sequence:

1. The batch splits into groups: decodes (the first `num_decode_seqs`
   sequences, one query each) and prefill chunks (the rest) never share a
   group, so a long prefill never pads every decode's queries to its chunk
   length; within each kind, sequences of similar length are grouped
   (`split_by_length`: greedy over the lengths sorted, by a cost model of
   padded work plus a fixed cost per group), so a few long contexts do not
   pad every short one to their length. A group's tokens are a slice of the
   packed batch when its sequences are adjacent, else an index tensor.
2. For a group of n sequences with longest context L, ONE gather per cache
   reads K and V as `[n, L, num_kv_heads, head_dim]` (padded), slot by slot
   through the block tables (`[n * L]` slot ids built once per step). A
   padded key position (past its sequence's end) reads the sequence's own
   position 0, written before any attention over it: the gather never reads
   a slot the sequence has not written, so the padding holds finite values
   (never cache garbage, never NaN) and needs no zeroing.
3. Queries are scattered into `[n, max_q, num_heads, head_dim]` (padded) and
   viewed as `[n, num_kv_heads, group * max_q, head_dim]`: a query head h uses
   KV head `h // group` (transformers' `repeat_kv` order), so grouped-query
   attention is a reshape, never a copy of K/V per query head.
4. One `scaled_dot_product_attention` in float32 over the strided K/V views
   (no copy besides the gather), with a boolean `[n, max_q, L]` mask: key
   position k is visible from query position p iff `k <= p` and, with a
   sliding window W, `k > p - W` (the mask is repeated over the group).
   Padded query rows see key 0 only (never a fully masked row, so no NaN) and
   are dropped when the outputs are packed back. Padded keys are masked and
   finite (step 2), so their zero probability times their value adds
   exactly 0: a cache slot never written (garbage, even NaN) is never read.

Index tensors and masks depend only on the step's metadata, so they are
built once per `AttentionMetadata` (cached weakly by instance) and reused by
every layer.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pagedinfer.kernels.metadata import AttentionMetadata


@dataclass
class _GroupPlan:
    """Index tensors of one group of sequences (all decodes, or all prefill chunks) of a step."""

    rows: slice | torch.Tensor  # the group's packed tokens: a slice, or int64 [num_tokens] when scattered
    max_query_len: int
    max_seq_len: int
    num_seqs: int
    slot_ids: torch.Tensor  # int64 [n * max_seq_len]: cache slot of each key; padding -> position 0
    query_pos: torch.Tensor  # int64 [n, max_query_len, 1]; padded rows point at position 0
    query_valid: torch.Tensor  # bool [n, max_query_len, 1]
    token_index: torch.Tensor | None  # int64 [num_tokens]: row of each packed token in [n * max_query_len]
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # sliding window -> bool [n, q, L]

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        cached = self.masks.get(sliding_window)
        if cached is None:
            key_pos = torch.arange(self.max_seq_len, device=self.query_pos.device)
            cached = key_pos <= self.query_pos
            if sliding_window is not None:
                cached = cached & (key_pos > self.query_pos - sliding_window)
            cached = torch.where(self.query_valid, cached, key_pos == 0)
            self.masks[sliding_window] = cached
        return cached


_PLANS: weakref.WeakKeyDictionary[AttentionMetadata, dict[int, list[_GroupPlan]]] = weakref.WeakKeyDictionary()

# Relative costs of a group, in units of one (query, key) score on this path:
# gathering one padded key position per sequence, and the fixed
# cost of one more group (a dozen small torch calls).
_GATHER_COST_PER_KEY = 16
_COST_PER_GROUP = 2048


def _group_cost(num_seqs: int, max_query_len: int, max_seq_len: int) -> int:
    return num_seqs * max_seq_len * (max_query_len + _GATHER_COST_PER_KEY) + _COST_PER_GROUP


def split_by_length(seq_lens: list[int], query_lens: list[int]) -> list[list[int]]:
    """Partition sequences into groups that each pad little (keys and queries are padded per group).

    Greedy over the sequences sorted by length: the next one joins the current
    group when that costs no more (by `_group_cost`) than opening a group of
    its own. Decodes and prefill chunks are split separately by the caller.
    """
    order = sorted(range(len(seq_lens)), key=seq_lens.__getitem__)
    groups: list[list[int]] = []
    max_q = max_len = 0
    for i in order:
        q, length = query_lens[i], seq_lens[i]
        if groups:
            n = len(groups[-1])
            merged = _group_cost(n + 1, max(max_q, q), length)
            if merged <= _group_cost(n, max_q, max_len) + _group_cost(1, q, length):
                groups[-1].append(i)
                max_q, max_len = max(max_q, q), length
                continue
        groups.append([i])
        max_q, max_len = q, length
    return groups


def _group_plans(metadata: AttentionMetadata, block_size: int) -> list[_GroupPlan]:
    by_block_size = _PLANS.setdefault(metadata, {})
    plans = by_block_size.get(block_size)
    if plans is None:
        num_decodes = metadata.num_decode_seqs
        seq_lens, query_lens = metadata.seq_lens_cpu, metadata.query_lens_cpu
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        plans = []
        for first, end in ((0, num_decodes), (num_decodes, metadata.num_seqs)):
            for group in split_by_length(seq_lens[first:end], query_lens[first:end]):
                plans.append(_build_group(metadata, sorted(first + i for i in group), starts, block_size))
        by_block_size[block_size] = plans
    return plans


def _build_group(metadata: AttentionMetadata, seqs: list[int], starts: list[int], block_size: int) -> _GroupPlan:
    device = metadata.block_tables.device
    seq_lens = [metadata.seq_lens_cpu[i] for i in seqs]
    query_lens = [metadata.query_lens_cpu[i] for i in seqs]
    max_seq_len, max_query_len = max(seq_lens), max(query_lens)
    num_blocks = -(-max_seq_len // block_size)
    if seqs[-1] - seqs[0] == len(seqs) - 1:
        rows: slice | torch.Tensor = slice(starts[seqs[0]], starts[seqs[-1] + 1])
        block_ids = metadata.block_tables[seqs[0] : seqs[-1] + 1, :num_blocks]
    else:
        rows = torch.tensor([t for i in seqs for t in range(starts[i], starts[i + 1])], device=device)
        block_ids = metadata.block_tables.index_select(0, torch.tensor(seqs, device=device))[:, :num_blocks]
    seq_lens_t = torch.tensor(seq_lens).unsqueeze(1)
    key_pos = torch.arange(max_seq_len)
    key_pos = torch.where(key_pos < seq_lens_t.to(device), key_pos.to(device), 0)
    slot_ids = block_ids.long().gather(1, key_pos // block_size) * block_size + key_pos % block_size
    offsets = torch.arange(max_query_len)
    query_lens_t = torch.tensor(query_lens).unsqueeze(1)
    query_valid = offsets < query_lens_t
    query_pos = torch.where(query_valid, seq_lens_t - query_lens_t + offsets, 0)
    token_index = None
    if min(query_lens) < max_query_len:
        token_index = (torch.arange(len(seq_lens)).unsqueeze(1) * max_query_len + offsets)[query_valid]
        token_index = token_index.to(device)
    return _GroupPlan(
        rows=rows,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        num_seqs=len(seqs),
        slot_ids=slot_ids.reshape(-1),
        query_pos=query_pos.unsqueeze(-1).to(device),
        query_valid=query_valid.unsqueeze(-1).to(device),
        token_index=token_index,
    )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attention of the step's packed queries `[num_tokens, num_heads, head_dim]` over the paged K/V.

    Mixed decode and prefill in one call; grouped-query attention when
    `num_heads` is a multiple of `num_kv_heads`. Returns `[num_tokens, num_heads, head_dim]`
    in the query's dtype, computed in float32.
    """
    num_heads = query.shape[1]
    block_size, num_kv_heads, head_dim = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.empty(query.shape[0], num_heads, value_cache.shape[3], dtype=query.dtype, device=query.device)
    for plan in _group_plans(metadata, block_size):
        n = plan.num_seqs
        q_max, seq_max = plan.max_query_len, plan.max_seq_len
        scattered = isinstance(plan.rows, torch.Tensor)
        q = (query.index_select(0, plan.rows) if scattered else query[plan.rows]).float()
        if plan.token_index is not None:
            q = q.new_zeros(n * q_max, num_heads, head_dim).index_copy_(0, plan.token_index, q)
        q = q.view(n, q_max, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(n, num_kv_heads, group * q_max, head_dim)
        k = key_cache.view(-1, num_kv_heads, head_dim).index_select(0, plan.slot_ids)
        v = value_cache.view(-1, num_kv_heads, value_cache.shape[3]).index_select(0, plan.slot_ids)
        k = k.view(n, seq_max, num_kv_heads, head_dim).transpose(1, 2).float()
        v = v.view(n, seq_max, num_kv_heads, -1).transpose(1, 2).float()
        mask = plan.mask(sliding_window)[:, None, None].expand(n, 1, group, q_max, seq_max)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.reshape(n, 1, group * q_max, seq_max), scale=scale)
        o = o.view(n, num_kv_heads, group, q_max, -1).permute(0, 3, 1, 2, 4)
        o = o.reshape(n * q_max, num_heads, -1)
        if plan.token_index is not None:
            o = o.index_select(0, plan.token_index)
        if scattered:
            out.index_copy_(0, plan.rows, o.to(out.dtype))
        else:
            out[plan.rows] = o.to(out.dtype)
    return out
