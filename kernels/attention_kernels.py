"""Triton kernels of paged attention: one tile kernel for decode and prefill, one split merge.

Algorithm (FlashAttention-2's online softmax, Dao 2023, over a paged cache as
in vLLM's PagedAttention, Kwon et al. 2023; split-K "flash-decoding" as in
Dao et al. 2023's Flash-Decoding note):

- A program owns one sequence, one KV head and a tile of `BLOCK_Q` query
  tokens of that sequence. Its `BLOCK_M` rows are (query token, query head of
  the KV head's group) pairs, so every K/V tile is loaded once per KV head and
  shared by the whole group (grouped-query attention). A decode is the case
  `BLOCK_Q = 1`: the rows are the group's heads (padded to 16 for `tl.dot`).
- Keys are visited in tiles of `TILE_N` positions. A tile may span several
  cache blocks: each position looks its physical block up in the block table
  (`position // BLOCK_SIZE`), so any block size works with any tile size.
- Only tiles a row can see are visited: from the sliding window's first key
  (or 0) to the tile holding the program's last query position (causal).
- Scores are kept in base 2 (`scale * log2(e)` folded in) in float32; the
  running max `m`, sum `l` and unnormalised output `acc` are rescaled per
  tile. A row that has seen no visible key yet keeps `m = -inf`; the
  `m_safe` guard turns its `exp2(-inf - -inf)` into `exp2(-inf) = 0`.
- Loads past a sequence's end are masked (`other=0`), so unwritten cache
  slots (garbage, NaN) are never read.
- Split-K: with `USE_SPLITS`, the visible tiles are cut into `num_splits`
  contiguous ranges along grid axis 2; each writes its `(m, l, acc)` to
  float32 scratch and `merge_splits_kernel` combines them:
  `out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s` with `M = max_s m_s`.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Integer arguments that change from step to step. Triton otherwise specialises
# every int argument on "== 1" and "divisible by 16" and compiles a new kernel
# whenever a value changes class, which a server would feel as a stall of about
# a second on some early steps.
_PER_STEP_INTS = ["first_seq", "num_q_tiles", "num_splits", "stride_bt"]


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    q,
    tile,
    seq,
    kv_head,
    seq_len,
    row_pos,
    sliding_window,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    scale_log2,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    dims,
    dim_valid,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One key tile of the online softmax: (acc, m, l) updated. Without MASKED every key of the tile is
    visible to every row (the caller's unmasked range): no causal mask and no bounds on the keys."""
    key_pos = tile * TILE_N + tl.arange(0, TILE_N)
    if MASKED:
        key_in = key_pos < seq_len
        block = tl.load(block_tables_ptr + seq * stride_bt + key_pos // BLOCK_SIZE, mask=key_in, other=0)
        kv_mask = key_in[:, None] & dim_valid[None, :]
    else:
        block = tl.load(block_tables_ptr + seq * stride_bt + key_pos // BLOCK_SIZE)
        kv_mask = dim_valid[None, :]
    kv_offs = block.to(tl.int64) * stride_cb + (key_pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
    kv_offs = kv_offs[:, None] + dims[None, :]
    k = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    if MASKED:
        visible = key_in[None, :] & (key_pos[None, :] <= row_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (key_pos[None, :] > row_pos[:, None] - sliding_window)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=_PER_STEP_INTS)
def paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim], query dtype
    partial_out_ptr,  # float32 [num_tokens, num_heads, num_splits, head_dim] (USE_SPLITS only)
    partial_max_ptr,  # float32 [num_tokens, num_heads, num_splits], base-2 running max
    partial_sum_ptr,  # float32 [num_tokens, num_heads, num_splits]
    query_ptr,  # [num_tokens, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, head_dim]
    value_cache_ptr,  # same shape and strides as the key cache
    block_tables_ptr,  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # int32 [num_seqs], context including the new tokens
    query_start_loc_ptr,  # int32 [num_seqs + 1]
    scale_log2,  # softmax scale * log2(e)
    sliding_window,  # keys at positions <= p - sliding_window are hidden (HAS_WINDOW only)
    first_seq,  # the sequence of grid row 0 (0 for decodes, num_decode_seqs for prefills)
    num_q_tiles,  # query tiles per sequence along grid axis 0
    num_splits,  # grid axis 2
    num_heads,
    stride_qt,
    stride_qh,  # query strides (head_dim stride is 1)
    stride_ot,
    stride_oh,  # out strides (head_dim stride is 1)
    stride_cb,
    stride_cs,
    stride_ch,  # cache strides: block, slot in block, KV head (head_dim stride is 1)
    stride_bt,  # block table row stride
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # next power of two of GROUP
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # rows per program, >= BLOCK_Q * GROUP_PAD and >= 16
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # next power of two of HEAD_DIM
    BLOCK_SIZE: tl.constexpr,  # cache block size in tokens
    TILE_N: tl.constexpr,  # key positions per loop iteration
    HAS_WINDOW: tl.constexpr,
    USE_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 caches (no TF32), None otherwise
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = first_seq + pid // num_q_tiles
    # a sequence's last query tiles (the most keys under the causal mask) first: the long programs start early
    q_tile_start = (num_q_tiles - 1 - pid % num_q_tiles) * BLOCK_Q
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_tile_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    row_tok = q_tile_start + rows // GROUP_PAD
    row_group = rows % GROUP_PAD
    row_valid = (rows // GROUP_PAD < BLOCK_Q) & (row_tok < q_len) & (row_group < GROUP)
    row_head = kv_head * GROUP + row_group
    row_pos = ctx_len + row_tok
    row_token = (q_start + row_tok).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM

    q = tl.load(
        query_ptr + row_token[:, None] * stride_qt + row_head[:, None] * stride_qh + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )
    q = q.to(key_cache_ptr.dtype.element_ty)

    last_pos = ctx_len + tl.minimum(q_tile_start + BLOCK_Q, q_len) - 1
    first_tile = 0
    if HAS_WINDOW:
        first_tile = tl.maximum(ctx_len + q_tile_start - sliding_window + 1, 0) // TILE_N
    num_tiles = tl.cdiv(last_pos + 1, TILE_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    start_tile = first_tile + split * tiles_per_split
    end_tile = tl.minimum(start_tile + tiles_per_split, first_tile + num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # tiles wholly before the program's first query position are visible to every row (and hold only keys
    # < seq_len): no causal mask, no bounds on the keys; the window, when there is one, masks every tile
    unmasked_end = start_tile
    if not HAS_WINDOW:
        unmasked_end = tl.minimum(tl.maximum((ctx_len + q_tile_start) // TILE_N, start_tile), end_tile)
    for tile in range(start_tile, unmasked_end):
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            tile,
            seq,
            kv_head,
            seq_len,
            row_pos,
            sliding_window,
            key_cache_ptr,
            value_cache_ptr,
            block_tables_ptr,
            scale_log2,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_bt,
            dims,
            dim_valid,
            BLOCK_SIZE,
            TILE_N,
            False,
            HAS_WINDOW,
            DOT_PRECISION,
        )
    for tile in range(unmasked_end, end_tile):
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            tile,
            seq,
            kv_head,
            seq_len,
            row_pos,
            sliding_window,
            key_cache_ptr,
            value_cache_ptr,
            block_tables_ptr,
            scale_log2,
            stride_cb,
            stride_cs,
            stride_ch,
            stride_bt,
            dims,
            dim_valid,
            BLOCK_SIZE,
            TILE_N,
            True,
            HAS_WINDOW,
            DOT_PRECISION,
        )

    if USE_SPLITS:
        partial = (row_token * num_heads + row_head) * num_splits + split
        tl.store(partial_max_ptr + partial, m_i, mask=row_valid)
        tl.store(partial_sum_ptr + partial, l_i, mask=row_valid)
        tl.store(
            partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :],
            acc,
            mask=row_valid[:, None] & dim_valid[None, :],
        )
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + row_token[:, None] * stride_ot + row_head[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dim_valid[None, :],
        )


@triton.jit(do_not_specialize=["num_splits"])
def merge_splits_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    partial_out_ptr,  # float32 [num_tokens, num_heads, num_splits, head_dim]
    partial_max_ptr,  # float32 [num_tokens, num_heads, num_splits]
    partial_sum_ptr,  # float32 [num_tokens, num_heads, num_splits]
    num_splits,
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # next power of two of num_splits
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_valid = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    partial = (token * num_heads + head) * num_splits + splits
    m = tl.load(partial_max_ptr + partial, mask=split_valid, other=float("-inf"))
    split_sum = tl.load(partial_sum_ptr + partial, mask=split_valid, other=0.0)
    weight = tl.exp2(m - tl.max(m, 0))
    acc = tl.load(
        partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :],
        mask=split_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(split_sum * weight, 0)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dim_valid)
