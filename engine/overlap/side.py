"""The engine's end of the output side: where a step's tokens become outputs (`EngineConfig.overlap`).

"off": each step's `OutputBatch` is processed inline, on the engine thread. "thread" or "process": the
batch goes to the output thread (`thread.py`) or process (`process.py`) and its result is taken by the next
step, right after that step's forward (`take_previous`), so a step returns the previous step's outputs.

Invariants: at most one batch is in flight; a sequence a stop string ended is ended on the engine (`end`)
before the engine samples it again (its token sampled meanwhile is dropped); a request leaves `requests` when
its last output is collected; the outputs of an aborted request are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pagedinfer.engine.detokenizer import IncrementalDetokenizer
from pagedinfer.engine.engine_setup import load_tokenizer
from pagedinfer.engine.overlap.process import OutputProcess
from pagedinfer.engine.overlap.text import OutputBatch, ProcessedBatch, TokenItem, process_batch
from pagedinfer.engine.overlap.thread import OutputThread
from pagedinfer.engine.sequence import Sequence


class OutputSide:
    def __init__(
        self,
        overlap: str,
        tokenizer_path: str,
        tokenizer: Any,
        requests: dict[str, Any],
        end: Callable[[Sequence, str], None],
    ) -> None:
        """tokenizer: the engine's (the output side's own on the output thread); requests: the engine's
        unfinished requests by id; end: ends a sequence on the engine and frees its blocks (seq, reason)."""
        self.requests = requests
        self.end = end
        self.worker: OutputThread | OutputProcess | None = None  # None: the output side runs inline
        if overlap == "thread":
            # its own tokenizer: a fast tokenizer may refuse a decode while another thread encodes with it
            self.tokenizer = load_tokenizer(tokenizer_path)
            self.worker = OutputThread(lambda batch: process_batch(batch, self.tokenizer))
        else:
            self.tokenizer = tokenizer
            if overlap == "process":  # the child holds the output side's state (overlap/mirror.py)
                self.worker = OutputProcess(tokenizer_path)
        # the detokenizers' `decode([id])` memo, one per skip_special_tokens (used on the output side only)
        self._pieces: dict[bool, dict[int, str]] = {True: {}, False: {}}

    @property
    def in_flight(self) -> bool:
        """A batch is on the output thread or process: the next step takes its result."""
        return self.worker is not None and self.worker.in_flight

    def detokenizer(self, prompt_token_ids: list[int], skip_special_tokens: bool) -> IncrementalDetokenizer:
        """A new sequence's detokenizer (the output side's tokenizer, its memo shared)."""
        return IncrementalDetokenizer(
            self.tokenizer, prompt_token_ids, skip_special_tokens, self._pieces[skip_special_tokens]
        )

    def take_previous(self) -> ProcessedBatch | None:
        """The output side's result for the previous step, its stop strings applied to the engine (None: none
        is in flight)."""
        return self._end_text_stops(self.worker.wait()) if self.in_flight else None

    def emit(self, items: list[TokenItem], touched: dict[str, Any], previous: ProcessedBatch | None, cumulative: bool):
        """Hand a step's tokens to the output side (or process them inline); the outputs ready now."""
        if self.worker is None:
            batch = OutputBatch(items, list(touched.values()), cumulative)
            return self.collect(self._end_text_stops(process_batch(batch, self.tokenizer)))
        if touched:  # else a step of prompt chunks only: nothing to hand over
            self.worker.submit(OutputBatch(items, list(touched.values()), cumulative))
        return self.collect(previous) if previous is not None else []

    def collect(self, processed: ProcessedBatch) -> list:
        """The outputs of a processed batch; a finished request leaves the engine (aborted ones: dropped)."""
        now = time.monotonic()
        outputs = []
        for req, output, finished in processed.outputs:
            if req.aborted:
                continue
            if finished:
                req.metrics.finished_time = now
                del self.requests[req.request_id]
            outputs.append(output)
        return outputs

    def forget(self, req: Any) -> None:
        """An aborted request: the output thread or process drops what it holds of it."""
        if self.worker is not None:
            self.worker.forget(req)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()

    def _end_text_stops(self, processed: ProcessedBatch) -> ProcessedBatch:
        """End (and free) each sequence a stop string ended on the output side."""
        for seq in processed.stopped:
            if not seq.is_finished:
                self.end(seq, "stop")
        return processed
