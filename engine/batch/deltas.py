"""Block-table deltas: what changed in the device block tables since the last step. Pure Python.

`TableChanges` is kept by the KV cache manager: every write to a table marks
the first index it touched; `take` turns the marks into updates (and the ids
of tables that no longer exist) and clears them. Applying, in order, every
`take` since a table was created to an empty mirror reproduces the table
exactly (the test in tests/engine/test_persistent_batch.py drives the
scheduler through preemption, swapping, prefix hits, chunked prefill, forks
and beams and checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockTableUpdate:
    """Set seq_id's table to table[:start] + block_ids (it becomes start + len(block_ids) long)."""

    seq_id: int
    start: int  # first index written; 0 for a table that is new (or was freed and rebuilt)
    block_ids: tuple[int, ...]  # the table's entries from `start` on


@dataclass(frozen=True)
class TableDeltas:
    updates: tuple[BlockTableUpdate, ...] = ()  # tables created or changed
    freed_seq_ids: tuple[int, ...] = ()  # tables that no longer exist (freed, swapped out); disjoint from updates


class TableChanges:
    """First changed index per table since the last `take` (a freed table is marked at 0)."""

    def __init__(self) -> None:
        self._first_changed: dict[int, int] = {}

    def mark(self, seq_id: int, index: int) -> None:
        current = self._first_changed.get(seq_id)
        if current is None or index < current:
            self._first_changed[seq_id] = index

    def take(self, table_of: Callable[[int], Sequence[int] | None]) -> TableDeltas:
        """The deltas since the last take; table_of(seq_id) is the table's block ids now, None if gone."""
        updates: list[BlockTableUpdate] = []
        freed: list[int] = []
        for seq_id, start in self._first_changed.items():
            table = table_of(seq_id)
            if table is None:
                freed.append(seq_id)
            else:
                updates.append(BlockTableUpdate(seq_id, start, tuple(table[start:])))
        self._first_changed.clear()
        return TableDeltas(tuple(updates), tuple(freed))
