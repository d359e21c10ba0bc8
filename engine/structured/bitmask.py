"""The grammar's allowed tokens as a bitmask over a whole step's constrained rows.

For the rows whose sequence has a matcher, llguidance fills one int32
bitmask row each (bit t of word t // 32 set: token t allowed) on the host,
all rows in parallel on its own threads (`LLExecutor`). The engine starts
that fill (`prefetch`) before the step's forward, on a worker thread, so
the host work overlaps the forward (the matchers' states are known then:
the last token was consumed in the previous step); the sampler then takes
the mask (`apply`). In a step that forked children (the prompt of an n > 1
request just finished), which were not prefetched, it fills the whole
step's mask again, synchronously. The mask goes to the device in one copy
(non-blocking from pinned memory on CUDA when the prefetched mask is used
as is) and one masked_fill sets the disallowed logits of those rows to
-inf. The engine's other EOS ids get the mask bit of the one EOS id the
backend knows (`eos.py`). Unconstrained rows are never touched: a step without constrained
rows does nothing here, and one with them adds host work, overlapped with
the forward, and the copies of the mask and of its row index.

Nothing here is loaded on first use: `warm_up()` (the server calls it at
start-up, before /health turns 200) makes the executor and the prefetch
thread, and the fill calls llguidance's executor directly on the tensor's
memory rather than through `llguidance.torch`, whose import compiles a
kernel with `torch.compile` (importing torch._dynamo: seconds, holding the
GIL), which, done by a request's first step, stalled every running request.

Invariant: from `prefetch` until `apply` returns, the matchers handed to
`prefetch` belong to the grammar thread: llguidance holds each one borrowed
while it fills it, and any other call on it then raises "Already mutably
borrowed". The engine thread touches none of them in between (n > 1
children get fresh matchers from the compile cache, not copies).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from pagedinfer.engine.structured.eos import GrammarEos


class GrammarBitmask:
    """Host buffers, the llguidance executor and the prefetch thread of one sampler."""

    def __init__(self, eos: GrammarEos | None = None) -> None:
        self.eos = eos if eos is not None else GrammarEos(None, ())
        self._executor: Any = None
        self._thread: ThreadPoolExecutor | None = None
        self._pending: tuple[list[Any], Future] | None = None

    def warm_up(self) -> None:
        """Make the llguidance executor and the prefetch thread now, so no step waits for them."""
        self._llexecutor()
        self._prefetch_thread()

    def _llexecutor(self) -> Any:
        if self._executor is None:
            from llguidance import LLExecutor

            self._executor = LLExecutor()
        return self._executor

    def _prefetch_thread(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedinfer-grammar")
        return self._thread

    def _fill(self, matchers: list[Any], vocab: int, pin: bool) -> torch.Tensor:
        words_per_row = (vocab + 31) // 32
        host = torch.empty((len(matchers), words_per_row), dtype=torch.int32, pin_memory=pin)
        # one contiguous int32 row of words_per_row words per matcher, at row i (llguidance drops the GIL)
        self._llexecutor().unsafe_compute_mask_ptr(
            [(m, i) for i, m in enumerate(matchers)], host.data_ptr(), words_per_row * 4, len(matchers)
        )
        return host

    def prefetch(self, matchers: list[Any], vocab: int, device: torch.device) -> None:
        """Start filling the masks of these matchers (this step's constrained rows) off the calling thread."""
        if not matchers:
            self._pending = None
            return
        self._pending = (
            list(matchers),
            self._prefetch_thread().submit(self._fill, list(matchers), vocab, device.type == "cuda"),
        )

    def apply(self, logits: torch.Tensor, rows: list[tuple[int, Any]]) -> None:
        """Mask logits [n, vocab] in place for each (row, matcher)."""
        pending, self._pending = self._pending, None
        if not rows:
            return
        vocab = logits.shape[1]
        matchers = [m for _, m in rows]
        host = None
        if pending is not None:
            prefetched = pending[1].result()
            position = {id(m): i for i, m in enumerate(pending[0])}
            if all(id(m) in position for m in matchers):
                host = (
                    prefetched[[position[id(m)] for m in matchers]]
                    if len(matchers) != len(pending[0]) or any(position[id(m)] != i for i, m in enumerate(matchers))
                    else prefetched
                )
        if host is None:
            host = self._fill(matchers, vocab, logits.device.type == "cuda")
        mask = host.to(logits.device, non_blocking=True)
        bits = torch.arange(32, dtype=torch.int32, device=logits.device)
        allowed = ((mask[:, :, None] >> bits) & 1).view(len(rows), -1)[:, :vocab]
        aliases = self.eos.aliases_in(vocab)
        if aliases:
            allowed[:, list(aliases)] = allowed[:, [self.eos.primary]]
        index = torch.tensor([row for row, _ in rows], device=logits.device)
        logits[index] = logits[index].masked_fill(allowed == 0, float("-inf"))
