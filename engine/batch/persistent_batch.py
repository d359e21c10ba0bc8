"""The block tables of every sequence with device blocks, one numpy row each, and a step's metadata from them.

Rows persist across steps: `apply` changes only what a step's `TableDeltas`
name, and `prepare` gathers the rows of the step's sequences with array
operations (positions, slot mapping, padded block tables, query starts)
instead of walking every token in Python.

Invariants: `row_of` holds exactly the sequences whose table was created and
not freed; row r's first `num_blocks[r]` entries are that table and the rest
of the row is 0 (so a gathered block table is 0-padded, as
`kernels.metadata.build_attention_metadata` pads it); a free row is all 0.
The arrays grow (doubling) when rows or a table's width run out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedinfer.engine.batch.deltas import TableDeltas
from pagedinfer.kernels.metadata import AttentionMetadata


class PersistentBatch:
    def __init__(self, block_size: int, num_rows: int = 64, max_blocks_per_seq: int = 16) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.block_tables = np.zeros((max(1, num_rows), max(1, max_blocks_per_seq)), dtype=np.int32)
        self.num_blocks = np.zeros(max(1, num_rows), dtype=np.int64)
        self.row_of: dict[int, int] = {}
        self._free_rows: list[int] = list(range(self.block_tables.shape[0] - 1, -1, -1))

    # ----- deltas ----------------------------------------------------------------------
    def apply(self, deltas: TableDeltas) -> None:
        for seq_id in deltas.freed_seq_ids:
            row = self.row_of.pop(seq_id, None)
            if row is not None:
                self.block_tables[row, : self.num_blocks[row]] = 0
                self.num_blocks[row] = 0
                self._free_rows.append(row)
        for update in deltas.updates:
            row = self.row_of.get(update.seq_id)
            if row is None:
                row = self._take_row(update.seq_id)
            old_end = int(self.num_blocks[row])
            if update.start > old_end:
                raise ValueError(
                    f"block table update for sequence {update.seq_id} starts at {update.start},"
                    f" past its {old_end} known blocks: a delta was lost"
                )
            end = update.start + len(update.block_ids)
            if end > self.block_tables.shape[1]:
                self._grow(self.block_tables.shape[0], end)
            self.block_tables[row, update.start : end] = update.block_ids
            if end < old_end:
                self.block_tables[row, end:old_end] = 0
            self.num_blocks[row] = end

    def table(self, seq_id: int) -> list[int]:
        row = self.row_of[seq_id]
        return self.block_tables[row, : self.num_blocks[row]].tolist()

    def _take_row(self, seq_id: int) -> int:
        if not self._free_rows:
            self._grow(2 * self.block_tables.shape[0], self.block_tables.shape[1])
        row = self._free_rows.pop()
        self.row_of[seq_id] = row
        return row

    def _grow(self, num_rows: int, width: int) -> None:
        old_rows, old_width = self.block_tables.shape
        num_rows = max(num_rows, old_rows)
        width = max(width, 2 * old_width) if width > old_width else old_width
        tables = np.zeros((num_rows, width), dtype=np.int32)
        tables[:old_rows, :old_width] = self.block_tables
        self.block_tables = tables
        self.num_blocks = np.concatenate([self.num_blocks, np.zeros(num_rows - old_rows, dtype=np.int64)])
        self._free_rows = list(range(num_rows - 1, old_rows - 1, -1)) + self._free_rows

    # ----- one step's metadata ------------------------------------------------------------
    def prepare(
        self, seq_ids: list[int], seq_lens: list[int], query_lens: list[int], device: torch.device | str = "cpu"
    ) -> tuple[AttentionMetadata, torch.Tensor]:
        """The step's AttentionMetadata and token positions [num_tokens] (int64), sequences in the given order.

        Equal, field by field, to `build_attention_metadata(seq_lens, query_lens, tables, block_size)` over
        these sequences' tables (tests/engine/test_persistent_batch.py checks it on random batches).
        """
        arrays = self.gather(seq_ids, seq_lens, query_lens)
        on_device = (
            (lambda a: torch.from_numpy(a))
            if torch.device(device).type == "cpu"
            else (lambda a: torch.from_numpy(a).to(device))
        )
        meta = AttentionMetadata(
            slot_mapping=on_device(arrays.slot_mapping),
            block_tables=on_device(np.ascontiguousarray(arrays.block_tables)),
            seq_lens=on_device(arrays.seq_lens.astype(np.int32)),
            query_start_loc=on_device(arrays.query_start_loc.astype(np.int32)),
            max_seq_len=max(seq_lens, default=0),
            max_query_len=max(query_lens, default=0),
            num_decode_seqs=arrays.num_decode_seqs,
            seq_lens_cpu=list(seq_lens),
            query_lens_cpu=list(query_lens),
        )
        return meta, on_device(arrays.positions)

    def gather(self, seq_ids: list[int], seq_lens: list[int], query_lens: list[int]) -> StepArrays:
        """The step's metadata as host arrays (`prepare` wraps them; the decode graphs copy them into
        their static buffers)."""
        num_seqs = len(seq_ids)
        bs = self.block_size
        try:
            rows = np.fromiter((self.row_of[s] for s in seq_ids), dtype=np.int64, count=num_seqs)
        except KeyError as exc:
            raise ValueError(f"sequence {exc.args[0]} has no block table in the persistent batch") from None
        lens = np.asarray(seq_lens, dtype=np.int64).reshape(num_seqs)
        q = np.asarray(query_lens, dtype=np.int64).reshape(num_seqs)
        num_blocks = self.num_blocks[rows]
        short = np.flatnonzero(num_blocks * bs < lens)
        if short.size:
            i = int(short[0])
            raise ValueError(f"sequence {seq_ids[i]} has {int(num_blocks[i])} blocks, too few for seq_len {lens[i]}")
        width = int(num_blocks.max()) if num_seqs else 0
        tables = self.block_tables[rows, :width]
        num_tokens = sum(query_lens)
        if num_tokens == num_seqs:  # decodes only (the common step): one token per row, no repeats
            positions = lens - 1
            starts = np.arange(num_seqs + 1, dtype=np.int64)
            blocks = tables[np.arange(num_seqs), positions // bs].astype(np.int64)
            num_decode_seqs = num_seqs
        else:
            starts = np.zeros(num_seqs + 1, dtype=np.int64)
            np.cumsum(q, out=starts[1:])
            token_seq = np.repeat(np.arange(num_seqs), q)
            positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(lens - q - starts[:-1], q)
            blocks = tables[token_seq, positions // bs].astype(np.int64)
            not_decode = np.flatnonzero(q != 1)
            num_decode_seqs = int(not_decode[0]) if not_decode.size else num_seqs
        return StepArrays(
            slot_mapping=blocks * bs + positions % bs,
            block_tables=tables,
            seq_lens=lens,
            query_start_loc=starts,
            positions=positions,
            num_decode_seqs=num_decode_seqs,
        )


@dataclass(frozen=True)
class StepArrays:
    """One step's attention inputs as host arrays, sequences in the step's order (`AttentionMetadata`'s fields)."""

    slot_mapping: np.ndarray  # int64 [num_tokens]
    block_tables: np.ndarray  # int32 [num_seqs, width]: the longest table's width, 0-padded (a gathered copy)
    seq_lens: np.ndarray  # int64 [num_seqs]
    query_start_loc: np.ndarray  # int64 [num_seqs + 1]
    positions: np.ndarray  # int64 [num_tokens]
    num_decode_seqs: int
