"""AttentionMetadata rejects inconsistent steps with an error naming the field."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pagedinfer.kernels.metadata import build_attention_metadata


def test_slots_follow_the_block_table():
    meta = build_attention_metadata([3, 6], [1, 4], [[7], [2, 5]], block_size=4)
    assert meta.slot_mapping.tolist() == [7 * 4 + 2, 2 * 4 + 2, 2 * 4 + 3, 5 * 4 + 0, 5 * 4 + 1]
    assert meta.query_start_loc.tolist() == [0, 1, 5]
    assert meta.block_tables.tolist() == [[7, 0], [2, 5]]
    assert (meta.num_decode_seqs, meta.num_seqs, meta.num_tokens) == (1, 2, 5)


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(query_lens_cpu=[1, 7]), "query_lens_cpu"),
        (dict(num_decode_seqs=2), "first num_decode_seqs"),
        (dict(max_seq_len=5), "max_seq_len"),
        (dict(max_query_len=3), "max_query_len"),
        (dict(block_tables=torch.zeros(2, 2, dtype=torch.int64)), "block_tables"),
        (dict(slot_mapping=torch.zeros(4, dtype=torch.int64)), "slot_mapping"),
        (dict(seq_lens_cpu=[3]), "query_lens_cpu"),
    ],
)
def test_inconsistent_metadata_names_the_field(change, field):
    meta = build_attention_metadata([3, 6], [1, 4], [[7], [2, 5]], block_size=4)
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(meta, **change)
