"""The runner's persistent batch: deltas rebuild the block tables exactly, and the metadata it gathers with
array operations equals the per-token builder's (kernels/metadata.build_attention_metadata)."""

from __future__ import annotations

import random

import pytest
import torch

from pagedinfer.engine.batch.deltas import BlockTableUpdate, TableDeltas
from pagedinfer.engine.batch.persistent_batch import PersistentBatch
from pagedinfer.kernels.metadata import build_attention_metadata

FIELDS = ("max_seq_len", "max_query_len", "num_decode_seqs", "seq_lens_cpu", "query_lens_cpu")
TENSORS = ("slot_mapping", "block_tables", "seq_lens", "query_start_loc")


def random_step(rng: random.Random, block_size: int, num_seqs: int, decodes_only: bool):
    """Decodes first, then prefill chunks (some after a cached prefix), on shuffled distinct blocks."""
    num_decodes = num_seqs if decodes_only else rng.randint(0, num_seqs)
    seq_lens, query_lens = [], []
    for i in range(num_seqs):
        seq_len = rng.randint(1, 90)
        seq_lens.append(seq_len)
        query_lens.append(1 if i < num_decodes else rng.randint(1, seq_len))
    blocks = list(range(1000))
    rng.shuffle(blocks)
    tables = []
    for seq_len in seq_lens:
        num_blocks = -(-seq_len // block_size) + rng.randint(0, 2)  # a table may hold more than it reads
        tables.append([blocks.pop() for _ in range(num_blocks)])
    return seq_lens, query_lens, tables


@pytest.mark.parametrize("decodes_only", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_metadata_from_array_ops_equals_the_per_token_builder(seed, decodes_only):
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    seq_lens, query_lens, tables = random_step(rng, block_size, rng.randint(0, 9), decodes_only)
    batch = PersistentBatch(block_size, num_rows=2, max_blocks_per_seq=2)  # small: the arrays must grow
    seq_ids = rng.sample(range(10_000), len(seq_lens))
    batch.apply(TableDeltas(tuple(BlockTableUpdate(s, 0, tuple(t)) for s, t in zip(seq_ids, tables))))
    got, positions = batch.prepare(seq_ids, seq_lens, query_lens)
    want = build_attention_metadata(seq_lens, query_lens, tables, block_size)
    for name in TENSORS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert [getattr(got, f) for f in FIELDS] == [getattr(want, f) for f in FIELDS]
    assert positions.tolist() == [p for s, q in zip(seq_lens, query_lens) for p in range(s - q, s)]


def test_updates_rewrite_a_table_from_their_start_and_freed_rows_are_reused_clean():
    batch = PersistentBatch(block_size=4, num_rows=1, max_blocks_per_seq=1)
    batch.apply(TableDeltas((BlockTableUpdate(7, 0, (3, 4, 5)),)))
    batch.apply(TableDeltas((BlockTableUpdate(7, 1, (9,)),)))  # copy-on-write of block 1, the tail dropped
    assert batch.table(7) == [3, 9]
    batch.apply(TableDeltas((BlockTableUpdate(7, 2, (6, 8)),)))
    assert batch.table(7) == [3, 9, 6, 8]
    batch.apply(TableDeltas((BlockTableUpdate(8, 0, (1,)),), freed_seq_ids=(7,)))
    assert list(batch.row_of) == [8] and batch.table(8) == [1]
    assert not batch.block_tables[[r for r in range(batch.block_tables.shape[0]) if r != batch.row_of[8]]].any()


def test_an_update_past_the_known_table_is_a_lost_delta():
    batch = PersistentBatch(block_size=4)
    batch.apply(TableDeltas((BlockTableUpdate(1, 0, (3,)),)))
    with pytest.raises(ValueError, match="starts at 2, past its 1 known blocks"):
        batch.apply(TableDeltas((BlockTableUpdate(1, 2, (4,)),)))
    with pytest.raises(ValueError, match="sequence 5 has no block table"):
        batch.prepare([5], [1], [1])
    with pytest.raises(ValueError, match="sequence 1 has 1 blocks, too few for seq_len 5"):
        batch.prepare([1], [5], [1])
