"""A step's token ids and logits rows written into host buffers kept across steps, instead of a torch.tensor each.

`torch.tensor(list)` walks the Python list through torch's generic sequence
conversion at every step (two per step: ids and logits rows, 1134 calls in
the tiny model's 192-request run). `IndexBuffer.put` writes the list into a
preallocated int64 numpy array (one C loop) and returns a torch view of its
first `len(values)` entries; on a CUDA runner the buffer is pinned and the
view is copied to the device.

Invariants:
- a `put` returns exactly the `len(values)` entries just written: never a
  row of an earlier, longer step (tests/engine/test_step_inputs.py runs a long
  step, then a short one, against a fresh runner);
- the returned CPU tensor aliases the buffer: it is valid until the next
  `put` on the same buffer (the runner's forward consumes it before the next
  step); a device copy is its own tensor (a blocking copy, so the host buffer
  may be rewritten as soon as `put` returns);
- capacity grows geometrically (doubling, at least to the request), never shrinks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class IndexBuffer:
    """A reusable int64 host buffer for one per-step index list."""

    def __init__(self, device: torch.device | str = "cpu", capacity: int = 256) -> None:
        self.device = torch.device(device)
        self._pin = self.device.type == "cuda"
        self._allocate(max(1, capacity))

    def _allocate(self, capacity: int) -> None:
        self._tensor = torch.empty(capacity, dtype=torch.int64, pin_memory=self._pin)
        self._array = self._tensor.numpy()

    @property
    def capacity(self) -> int:
        return self._array.shape[0]

    def put(self, values: Sequence[int]) -> torch.Tensor:
        """`torch.tensor(values, dtype=torch.long, device=self.device)`, from the reused buffer (see invariants)."""
        n = len(values)
        if n > self.capacity:
            self._allocate(max(n, 2 * self.capacity))
        self._array[:n] = values
        view = self._tensor[:n]
        return view if self.device.type == "cpu" else view.to(self.device)
