"""What sleep and wake do to an `LLMEngine`. Called on the engine's own thread (it is not thread-safe).

Sleep (only with no request in the engine: `SleepRefused` otherwise, which the
server answers 409):
1. the prefix cache is emptied, the host tier's entries too (their host pool
   is released below): every cached hash forgotten, and the block pool reports
   AllBlocksCleared on its KV-event sink, so a router's view of this engine's
   cache is empty too (the pool's blocks are all free already);
2. the KV pool's tensors (the device pool and the host pool: swap and tier) are
   released: `allocate_kv_cache(0, 0)`, on every tensor-parallel rank;
3. on a device other than the CPU, the weights move to pinned host memory
   (`weights.py`; rank 0's: other tensor-parallel ranks keep theirs), and the
   allocator's cache is emptied, so the device memory is free for others. On
   a CPU the weights stay where they are: they are host memory already.

Wake: the weights back first, then the same pools as before (the same block
counts: the KV manager's bookkeeping never changed), which re-captures the
decode graphs over the new addresses and re-runs a compiled forward's warm-up.
Both are idempotent: sleeping asleep, or waking awake, changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pagedinfer.engine.sleep.weights import OffloadedWeights, offload, restore


class SleepRefused(ValueError):
    """The engine still has requests: it cannot sleep now."""


@dataclass(frozen=True)
class SleepReport:
    is_sleeping: bool
    kv_bytes: int  # the KV pools (device and host swap) released by sleep, or allocated again by wake
    weight_bytes: int  # moved to host memory by sleep, or back by wake (0 on a CPU engine)
    seconds: float


class EngineSleep:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.sleeping = False
        self._weights: OffloadedWeights | None = None

    def _kv_bytes(self) -> int:
        engine = self.engine
        return (engine.num_gpu_blocks + engine.num_cpu_blocks) * engine.bytes_per_block

    def sleep(self) -> SleepReport:
        if self.sleeping:
            return SleepReport(True, 0, 0, 0.0)
        engine = self.engine
        if engine.has_unfinished_requests():
            raise SleepRefused(f"the engine has {len(engine.requests)} requests in flight; sleep once they finish")
        start = time.perf_counter()
        engine.kv.reset_prefix_cache()  # the device pool's and the host tier's: one AllBlocksCleared
        runner = engine.runner
        runner.allocate_kv_cache(0, 0)
        weights = None
        if runner.device.type != "cpu":
            weights = offload(runner.model)
            _empty_device_cache(runner.device)
        self._weights = weights
        self.sleeping = True
        return SleepReport(True, self._kv_bytes(), weights.num_bytes if weights else 0, time.perf_counter() - start)

    def wake(self) -> SleepReport:
        if not self.sleeping:
            return SleepReport(False, 0, 0, 0.0)
        engine = self.engine
        start = time.perf_counter()
        num_weight_bytes = 0
        if self._weights is not None:
            num_weight_bytes = self._weights.num_bytes
            restore(self._weights)
            self._weights = None
        engine.runner.allocate_kv_cache(engine.num_gpu_blocks, engine.num_cpu_blocks)
        self.sleeping = False
        return SleepReport(False, self._kv_bytes(), num_weight_bytes, time.perf_counter() - start)


def _empty_device_cache(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
