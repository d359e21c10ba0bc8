"""The tier's direct copies (`copy_block_runs`): the runs cover every pair once, and copying by runs moves
exactly what `swap_blocks` (the staged path) moves. On CUDA these copies are asynchronous memcpys between the
device pool and the pinned pool; here the same slicing runs on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from pagedinfer.engine.kv_offload.copies import block_runs, copy_block_runs
from pagedinfer.kernels import dispatch


def test_runs_join_consecutive_pairs_only_and_cover_every_pair_in_order():
    pairs = ((3, 7), (4, 8), (5, 9), (9, 1), (10, 3), (11, 4), (0, 0))
    assert block_runs(pairs) == [(3, 7, 3), (9, 1, 1), (10, 3, 2), (0, 0, 1)]
    assert [(s + i, d + i) for s, d, n in block_runs(pairs) for i in range(n)] == list(pairs)
    assert block_runs(()) == []


@pytest.mark.parametrize("pairs", [((0, 5), (1, 6), (2, 7)), ((6, 0), (2, 3), (3, 4), (7, 1)), ((1, 1),)])
def test_copying_by_runs_moves_what_swap_blocks_moves(pairs):
    torch.manual_seed(0)
    src = torch.randn(2, 3, 8, 4, 2, 5)
    dst_runs = torch.randn(2, 3, 9, 4, 2, 5)
    dst_swap = dst_runs.clone()
    copy_block_runs(src, dst_runs, pairs)
    dispatch.swap_blocks(src, dst_swap, torch.tensor(pairs).view(-1, 2), block_dim=2)
    assert torch.equal(dst_runs, dst_swap)


def test_caches_of_other_shapes_are_refused():
    with pytest.raises(ValueError, match="differ outside the block dimension"):
        copy_block_runs(torch.zeros(2, 3, 4, 5), torch.zeros(2, 2, 4, 5), ((0, 0),))
