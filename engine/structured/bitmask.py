"""The grammar's allowed tokens as a bitmask over a whole step's constrained rows.

For the rows whose sequence has a matcher, llguidance fills one int32
bitmask row each (bit t of word t // 32 set: token t allowed) on the host,
all rows in parallel on its own threads (`LLExecutor`), while the device
may still run the forward; the mask goes to the device in one copy
(non-blocking from pinned memory on CUDA) and one masked_fill sets the
disallowed logits of those rows to -inf. Unconstrained rows are never
touched, and nothing here waits on the device: a constrained row costs the
step host work proportional to the constrained rows, and no sync.
"""

from __future__ import annotations

from typing import Any

import torch


def _bit_positions(device: torch.device) -> torch.Tensor:
    return torch.arange(32, dtype=torch.int32, device=device)


class GrammarBitmask:
    """Reusable host buffers and the llguidance executor for one sampler."""

    def __init__(self) -> None:
        self._executor: Any = None
        self._host: torch.Tensor | None = None

    def apply(self, logits: torch.Tensor, matchers: list[tuple[int, Any]]) -> None:
        """Mask logits [rows, vocab] in place for each (row, matcher)."""
        if not matchers:
            return
        from llguidance import LLExecutor
        from llguidance.torch import fill_next_token_bitmask_par

        if self._executor is None:
            self._executor = LLExecutor()
        vocab = logits.shape[1]
        words = (vocab + 31) // 32
        if self._host is None or self._host.shape[0] < len(matchers) or self._host.shape[1] != words:
            self._host = torch.empty((max(len(matchers), 8), words), dtype=torch.int32,
                                     pin_memory=logits.device.type == "cuda")
        host = self._host[: len(matchers)]
        fill_next_token_bitmask_par(self._executor, [(m, i) for i, (_, m) in enumerate(matchers)], host)
        mask = host.to(logits.device, non_blocking=True)
        allowed = ((mask[:, :, None] >> _bit_positions(logits.device)) & 1).view(len(matchers), -1)[:, :vocab]
        rows = torch.tensor([row for row, _ in matchers], device=logits.device)
        logits[rows] = logits[rows].masked_fill(allowed == 0, float("-inf"))
