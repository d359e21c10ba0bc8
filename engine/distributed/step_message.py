"""What rank 0 tells the other ranks each step, packed into int64 words.

A message is [kind, num_words, num_tokens, num_seqs, num_rows, num_copies,
num_swaps_out, num_swaps_in, num_updates, num_freed, num_tier_stores,
num_tier_loads] followed by token_ids, seq_ids, seq_lens, query_lens,
logits_rows, the (src, dst) pairs of block copies, swaps out and swaps in,
the host tier's stores and loads (engine/kv_offload/), the freed seq ids, and each block-table
update as [seq_id, start, count, block ids...]. Positions are not sent:
sequence i's tokens sit at [seq_len - query_len, seq_len). Block tables are
not sent either: only their deltas since the last step (engine/batch/),
which every rank applies to its own persistent batch, so every rank holds
the same tables.

It travels in ONE broadcast of a fixed-size buffer (`capacity_words`, sized
from the config so that any step within max_num_batched_tokens and
max_num_seqs with modest block-table deltas fits); a larger message sends the
words past the buffer in a second broadcast, whose size the first one announced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas

STEP, ALLOCATE, STOP = 1, 2, 3
_HEADER_WORDS = 12
_SPARE_TABLE_WORDS = 4096  # block-table and block-copy words a single broadcast carries beyond tokens and seqs


@dataclass(frozen=True)
class StepInputs:
    """One forward's inputs, identical on every rank."""

    token_ids: list[int]  # the step's new tokens, packed, decodes first
    seq_ids: list[int]  # per sequence: its id, the key of its block table in the persistent batch
    seq_lens: list[int]  # per sequence: context length including this step's tokens
    query_lens: list[int]  # per sequence: new tokens this step
    logits_rows: list[int]  # token indices whose logits are kept (the last of each sampling sequence)
    table_deltas: TableDeltas = TableDeltas()  # block tables changed since the last step, applied first
    blocks_to_copy: tuple[tuple[int, int], ...] = ()
    blocks_to_swap_out: tuple[tuple[int, int], ...] = ()  # (device block, host block)
    blocks_to_swap_in: tuple[tuple[int, int], ...] = ()  # (host block, device block)
    tier_stores: tuple[tuple[int, int], ...] = ()  # (device block, host block): the host tier's, run first
    tier_loads: tuple[tuple[int, int], ...] = ()  # (host block, device block): after the swap-ins


@dataclass(frozen=True)
class Message:
    kind: int
    step: StepInputs | None = None
    num_gpu_blocks: int = 0  # ALLOCATE
    num_cpu_blocks: int = 0


def capacity_words(max_num_batched_tokens: int, max_num_seqs: int) -> int:
    return _HEADER_WORDS + max_num_batched_tokens + 8 * max_num_seqs + _SPARE_TABLE_WORDS


def pack(message: Message) -> torch.Tensor:
    if message.kind != STEP:
        return torch.tensor(
            [message.kind, _HEADER_WORDS, message.num_gpu_blocks, message.num_cpu_blocks] + [0] * (_HEADER_WORDS - 4),
            dtype=torch.int64,
        )
    s = message.step
    deltas = s.table_deltas
    words = [
        STEP,
        0,
        len(s.token_ids),
        len(s.seq_lens),
        len(s.logits_rows),
        len(s.blocks_to_copy),
        len(s.blocks_to_swap_out),
        len(s.blocks_to_swap_in),
        len(deltas.updates),
        len(deltas.freed_seq_ids),
        len(s.tier_stores),
        len(s.tier_loads),
    ]
    words += s.token_ids + s.seq_ids + s.seq_lens + s.query_lens + s.logits_rows
    for pairs in (s.blocks_to_copy, s.blocks_to_swap_out, s.blocks_to_swap_in, s.tier_stores, s.tier_loads):
        for src, dst in pairs:
            words += (src, dst)
    words += deltas.freed_seq_ids
    for update in deltas.updates:
        words += (update.seq_id, update.start, len(update.block_ids))
        words += update.block_ids
    words[1] = len(words)
    return torch.tensor(words, dtype=torch.int64)


def unpack(words: torch.Tensor) -> Message:
    w = words.tolist()
    kind = w[0]
    if kind != STEP:
        return Message(kind, num_gpu_blocks=w[2], num_cpu_blocks=w[3])
    num_tokens, num_seqs, num_rows, num_copy, num_out, num_in, num_updates, num_freed, num_stores, num_loads = w[
        2:_HEADER_WORDS
    ]
    at = _HEADER_WORDS

    def take(count: int) -> list[int]:
        nonlocal at
        at += count
        return w[at - count : at]

    token_ids, seq_ids, seq_lens, query_lens = take(num_tokens), take(num_seqs), take(num_seqs), take(num_seqs)
    rows = take(num_rows)
    pairs = [tuple(zip(*[iter(take(2 * count))] * 2)) for count in (num_copy, num_out, num_in, num_stores, num_loads)]
    freed = tuple(take(num_freed))
    updates = []
    for _ in range(num_updates):
        seq_id, start, count = take(3)
        updates.append(BlockTableUpdate(seq_id, start, tuple(take(count))))
    copies, swaps_out, swaps_in, tier_stores, tier_loads = pairs
    return Message(
        STEP,
        StepInputs(
            token_ids,
            seq_ids,
            seq_lens,
            query_lens,
            rows,
            TableDeltas(tuple(updates), freed),
            copies,
            swaps_out,
            swaps_in,
            tier_stores,
            tier_loads,
        ),
    )
