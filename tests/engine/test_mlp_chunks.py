"""The MLP's row chunks (engine/cpu/mlp_chunks.py): how many rows a chunk takes, and that chunking keeps each row's result.

The fused decoder's logits with chunking forced are checked in tests/engine/test_fused_layers.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedinfer.engine.cpu.layer_plan import Projection
from pagedinfer.engine.cpu.mlp_chunks import MLP_CHUNK_BYTES, chunked_mlp, max_chunk_rows, num_chunks
from pagedinfer.kernels.cpu import layer_ops


def test_the_125m_float32_prefill_of_2048_tokens_runs_its_mlp_in_two_chunks():
    """gate_up 768 -> 2 x 2048: 16 KiB of output per float32 row, 32 MiB for 2048 rows (glibc maps that afresh)."""
    fp32_rows = max_chunk_rows(2 * 2048 * 4)
    assert fp32_rows == 1024 and fp32_rows * 2 * 2048 * 4 <= MLP_CHUNK_BYTES < 32 * 2**20
    assert [num_chunks(rows, fp32_rows) for rows in (1, 48, 1024, 1025, 2000, 2048)] == [1, 1, 1, 2, 2, 2]
    assert num_chunks(2048, max_chunk_rows(2 * 2048 * 2)) == 1  # bf16: 16 MiB, one call as before
    assert max_chunk_rows(MLP_CHUNK_BYTES * 3) == 1  # a row wider than a chunk: one row at a time


def test_nonpositive_sizes_are_refused():
    with pytest.raises(ValueError, match="gate_up_row_bytes"):
        max_chunk_rows(0)
    with pytest.raises(ValueError, match="chunk_bytes"):
        max_chunk_rows(16, chunk_bytes=0)


@pytest.mark.parametrize(
    "rows, max_rows, sizes", [(30, 7, [6] * 5), (31, 8, [8, 8, 8, 7]), (5, 8, [5]), (3, 1, [1, 1, 1])]
)
def test_chunked_mlp_gives_each_rows_unchunked_result(rows, max_rows, sizes):
    if not layer_ops.available(torch.float32):
        pytest.skip("no native layer ops (no C++ compiler)")
    torch.manual_seed(0)
    hidden, inter = 24, 40
    x = torch.randn(rows, hidden)
    gate_up_weight, down_weight = torch.randn(2 * inter, hidden), torch.randn(hidden, inter)
    seen = []

    def gate_up_fn(part, weight):
        seen.append(part.shape[0])
        return F.linear(part, weight)

    got = chunked_mlp(x, Projection(gate_up_fn, (gate_up_weight,)), Projection(F.linear, (down_weight,)), max_rows)
    gate, up = F.linear(x, gate_up_weight).chunk(2, dim=-1)
    torch.testing.assert_close(got, F.linear(F.silu(gate) * up, down_weight), rtol=1e-5, atol=1e-4)
    assert seen == sizes
