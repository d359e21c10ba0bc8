"""The model's weights to pinned host memory and back, one device storage at a time.

Each distinct storage behind the model's parameters and buffers is copied to
a pinned host buffer, then resized to 0 bytes, which frees its device memory
for every tensor that shares it: the parameters themselves and any view of
them held elsewhere (fused projections, a decoder's bound plan). On wake the
storage is resized back (the allocator may give a new address) and filled
from the host copy, so every such tensor sees its own bytes again, unchanged.
Anything captured over the old addresses (CUDA graphs) must be captured
again: the runner does, when the KV pool is allocated after the weights are
back.

Only device (non-CPU) storages move: on a CPU engine the weights already
live in host memory and stay where they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def on_a_device(tensor: torch.Tensor) -> bool:
    return tensor.device.type != "cpu"


def _storages(model: torch.nn.Module, moves: Callable[[torch.Tensor], bool]) -> list[torch.UntypedStorage]:
    seen: dict[int, torch.UntypedStorage] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if not moves(tensor):
            continue
        storage = tensor.untyped_storage()
        seen.setdefault(storage.data_ptr(), storage)
    return [s for s in seen.values() if s.nbytes() > 0]


def _bytes_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    view = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return view.set_(storage, 0, (storage.nbytes(),), (1,))


@dataclass
class OffloadedWeights:
    """The host copies of a model's device storages, while it sleeps."""

    moved: list[tuple[torch.UntypedStorage, torch.Tensor]] = field(default_factory=list)  # (storage, host bytes)

    @property
    def num_bytes(self) -> int:
        return sum(host.numel() for _, host in self.moved)


def offload(model: torch.nn.Module, moves: Callable[[torch.Tensor], bool] = on_a_device) -> OffloadedWeights:
    """Copy each storage of the model's tensors that `moves` (by default: those on a device) to host memory
    (pinned where CUDA is) and free it where it was."""
    offloaded = OffloadedWeights()
    for storage in _storages(model, moves):
        host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        host.copy_(_bytes_view(storage))
        offloaded.moved.append((storage, host))
    _synchronize(offloaded)
    for storage, _ in offloaded.moved:
        storage.resize_(0)
    return offloaded


def restore(offloaded: OffloadedWeights) -> None:
    """Give each storage its device memory back and its bytes from the host copy."""
    for storage, host in offloaded.moved:
        storage.resize_(host.numel())
        _bytes_view(storage).copy_(host, non_blocking=True)
    _synchronize(offloaded)
    offloaded.moved.clear()


def _synchronize(offloaded: OffloadedWeights) -> None:
    """Wait for the copies (a non-blocking copy from pinned memory returns before it is done)."""
    if any(storage.device.type == "cuda" for storage, _ in offloaded.moved):
        torch.cuda.synchronize()
