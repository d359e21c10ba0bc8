"""The runner's side of the tier: the step's block copies between the device pool and the host pool, timed.

On a CPU engine both pools are host tensors (the tier is a second pool) and a
copy is a gather and a scatter, timed on the wall clock. On CUDA the host pool
is pinned memory (`ModelRunner.allocate_kv_cache`) and the copies run on their
own stream: it waits for the compute stream (the device blocks' content is
final), copies, and the compute stream waits for it before the step's own
writes (the package docstring's order). They overlap whatever the compute
stream has queued before the wait and the host's preparation of the step; they
are timed with CUDA events, read without a sync once they have completed (a
later step). This path is written, not yet measured on a GPU (docs/kv-offload.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from pagedinfer.engine.kv_offload.tier import LOAD, STORE
from pagedinfer.kernels import dispatch


@dataclass
class CopyTotals:
    """Cumulative copy time per direction (seconds), of copies whose time is known."""

    seconds: dict[str, float] = field(default_factory=lambda: {STORE: 0.0, LOAD: 0.0})


class TierCopier:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.totals = CopyTotals()
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []  # CUDA copies not yet timed

    def copy(self, direction: str, src: torch.Tensor, dst: torch.Tensor, pairs: tuple[tuple[int, int], ...]
             ) -> None:
        """Copy blocks `(src block, dst block)` of the `[2, layers, blocks, ...]` caches, every layer at once."""
        if not pairs:
            return
        mapping = torch.tensor(pairs, dtype=torch.long).view(-1, 2)
        if self._stream is None:
            start = time.perf_counter()
            dispatch.swap_blocks(src, dst, mapping, block_dim=2)
            self.totals.seconds[direction] += time.perf_counter() - start
            return
        compute = torch.cuda.current_stream(self.device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._stream.wait_stream(compute)
        with torch.cuda.stream(self._stream):
            begin.record(self._stream)
            dispatch.swap_blocks(src, dst, mapping, block_dim=2)
            end.record(self._stream)
        compute.wait_stream(self._stream)
        self._pending.append((direction, begin, end))

    def seconds(self) -> dict[str, float]:
        """Copy time so far per direction; on CUDA, of the copies that have completed (no sync)."""
        still = []
        for direction, begin, end in self._pending:
            if end.query():
                self.totals.seconds[direction] += begin.elapsed_time(end) / 1000.0
            else:
                still.append((direction, begin, end))
        self._pending = still
        return dict(self.totals.seconds)
