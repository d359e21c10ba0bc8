"""The runner's side of the tier: the step's block copies between the device pool and the host pool, timed.

On a CPU engine both pools are host tensors (the tier is a second pool) and a
copy is a gather and a scatter, timed on the wall clock. On CUDA the host pool
is pinned memory (`ModelRunner.allocate_kv_cache`) and the copies run on their
own stream, as `copy_block_runs`: one asynchronous copy per run of consecutive
blocks per cache, straight between the device pool and the pinned pool (no
staging tensor, so the host never waits for a copy and what a copy reads is
read when the stream runs it: stream order is the only order the copies
need); it waits for the compute stream (the device blocks' content is
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


def block_runs(pairs: tuple[tuple[int, int], ...]) -> list[tuple[int, int, int]]:
    """`(src, dst, count)` runs: consecutive pairs whose source and destination both step by one, in order.

    Covers every pair exactly once and keeps the pairs' order (destinations are distinct, so the order
    changes nothing a copy reads)."""
    runs: list[tuple[int, int, int]] = []
    for src, dst in pairs:
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((src, dst, 1))
    return runs


def copy_block_runs(src: torch.Tensor, dst: torch.Tensor, pairs: tuple[tuple[int, int], ...]) -> None:
    """Copy blocks `(src block, dst block)` of the `[2, layers, blocks, ...]` caches, one `copy_` per run and cache.

    Each copy is between contiguous slices, so with one side on CUDA and the other pinned, `non_blocking`
    makes it an asynchronous memcpy on the current stream (a non-contiguous or pageable side would make torch
    stage it through a temporary and wait). Device-agnostic: the CPU tests check it against `swap_blocks`."""
    if src.shape[:2] != dst.shape[:2] or src.shape[3:] != dst.shape[3:]:
        raise ValueError(f"caches {tuple(src.shape)} and {tuple(dst.shape)} differ outside the block dimension")
    sources, destinations = src.flatten(0, 1), dst.flatten(0, 1)
    for s, d, n in block_runs(pairs):
        for cache in range(sources.shape[0]):
            destinations[cache, d : d + n].copy_(sources[cache, s : s + n], non_blocking=True)


def _direct(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether the copy can run as `copy_block_runs` asynchronously: contiguous, and the host side pinned."""
    host = src if src.device.type == "cpu" else dst
    return src.is_contiguous() and dst.is_contiguous() and host.device.type == "cpu" and host.is_pinned()


def _swap_blocks(src: torch.Tensor, dst: torch.Tensor, pairs: tuple[tuple[int, int], ...]) -> None:
    """The copy as `dispatch.swap_blocks` (a gather and a scatter on a CPU): the pairs as its `[n, 2]` mapping."""
    dispatch.swap_blocks(src, dst, torch.tensor(pairs, dtype=torch.long).view(-1, 2), block_dim=2)


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

    def copy(self, direction: str, src: torch.Tensor, dst: torch.Tensor, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy blocks `(src block, dst block)` of the `[2, layers, blocks, ...]` caches, every layer at once."""
        if not pairs:
            return
        if self._stream is None:
            start = time.perf_counter()
            _swap_blocks(src, dst, pairs)
            self.totals.seconds[direction] += time.perf_counter() - start
            return
        compute = torch.cuda.current_stream(self.device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._stream.wait_stream(compute)
        with torch.cuda.stream(self._stream):
            begin.record(self._stream)
            if _direct(src, dst):
                copy_block_runs(src, dst, pairs)
            else:
                _swap_blocks(src, dst, pairs)
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
