"""The process groups of one tensor-parallel replica, built without torch's global default group.

Each replica gets its own TCPStore (rank 0 listens on a free port of
127.0.0.1), so several replicas can live in one process (tests) and nothing
depends on torch.distributed's global state. Two groups:
- `control`: gloo, CPU tensors; rank 0's step broadcast. Its timeout is long,
  since workers wait in it while the server is idle; a dead peer is reported
  by gloo at once ("Connection closed by peer"), not by the timeout.
- `compute`: the forward's collectives (all-reduce, all-gather); the same gloo
  group on CPU, NCCL on CUDA (whose timeout bounds a step, not idleness).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

CONTROL_TIMEOUT = datetime.timedelta(days=365)  # idle servers wait here; dead peers are detected by gloo
STEP_TIMEOUT = datetime.timedelta(minutes=10)  # one forward's collectives on NCCL
STORE_TIMEOUT = datetime.timedelta(minutes=15)  # workers loading a large model before they join


def create_store(world_size: int) -> dist.TCPStore:
    """Rank 0's store on a free loopback port (read `.port`); workers connect to it."""
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)


def connect_store(port: int, world_size: int | None) -> dist.TCPStore:
    """A connection to rank 0's store: a rank's (`world_size` set), or None for one that is no rank's
    (rank 0's own second connection, which polls while its first may be blocked in a rendezvous)."""
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=STORE_TIMEOUT)


@dataclass
class TPGroup:
    """This process's place in a replica and its two groups."""

    rank: int
    world_size: int
    store: dist.Store
    control: dist.ProcessGroupGloo
    compute: object  # ProcessGroupGloo (CPU) or ProcessGroupNCCL (CUDA)

    @classmethod
    def join(cls, store: dist.Store, rank: int, world_size: int, device: torch.device) -> TPGroup:
        control = dist.ProcessGroupGloo(dist.PrefixStore("control/", store), rank, world_size, CONTROL_TIMEOUT)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL communicators and Triton launches use the current device
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = STEP_TIMEOUT
            compute = dist.ProcessGroupNCCL(dist.PrefixStore("compute/", store), rank, world_size, options)
        else:
            compute = control
        return cls(rank, world_size, store, control, compute)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place."""
        self.compute.allreduce([tensor]).wait()
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `tensor` along the last dimension, rank order."""
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self.compute.allgather([parts], [tensor]).wait()
        return torch.cat(parts, dim=-1)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's CPU `tensor` into every other rank's `tensor` of the same shape (control group)."""
        self.control.broadcast(tensor, 0).wait()
