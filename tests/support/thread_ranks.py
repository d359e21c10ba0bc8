"""N tensor-parallel ranks as threads of the test process: sharding-level tests without processes or gloo.

Each rank's group has the two collectives the sharded layers call
(`TPGroup.all_reduce`, `TPGroup.all_gather_last_dim`), met at a barrier:
every rank sums (or concatenates) the N tensors in rank order, so all ranks
hold bitwise the same result, as a real all-reduce gives them. A rank that
raises breaks the barrier, so the others fail instead of waiting.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

TIMEOUT_S = 60.0


class ThreadRanks:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=TIMEOUT_S)
        self._slots: list[torch.Tensor | None] = [None] * world_size

    def group(self, rank: int) -> ThreadGroup:
        return ThreadGroup(self, rank)

    def _exchange(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self._slots[rank] = tensor.clone()
        self._barrier.wait()
        parts = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return parts

    def run(self, fn: Callable[[ThreadGroup], Any]) -> list[Any]:
        """fn(group) on every rank at once; the results in rank order (the first error re-raised)."""
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            try:
                results[rank] = fn(self.group(rank))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors.append(exc)
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


class ThreadGroup:
    """One rank's view: `rank`, `world_size` and the collectives of engine/distributed/group.py's TPGroup."""

    def __init__(self, ranks: ThreadRanks, rank: int) -> None:
        self.ranks, self.rank, self.world_size = ranks, rank, ranks.world_size

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = self.ranks._exchange(self.rank, tensor)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return tensor.copy_(total)

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.ranks._exchange(self.rank, tensor.contiguous()), dim=-1)


def shard_on_ranks(model: nn.Module, world_size: int) -> tuple[ThreadRanks, list[nn.Module]]:
    """N deep copies of `model`, rank r's sharded for rank r (sharding itself runs no collective)."""
    from pagedinfer.engine.distributed.sharding import shard_model

    ranks = ThreadRanks(world_size)
    copies = []
    for rank in range(world_size):
        shard = copy.deepcopy(model)
        shard_model(shard, ranks.group(rank))
        copies.append(shard)
    return ranks, copies
