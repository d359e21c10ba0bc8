"""The model's decoder compiled with torch.compile (inductor, CPU), one static graph per token bucket.

A step's packed token count varies from 1 to max_num_batched_tokens; a graph
compiled for one count would recompile at the next. The count is padded up
to a bucket (powers of two, then max_num_batched_tokens itself), each bucket
is compiled once with static shapes at start-up (`warm_up`), and no step
compiles afterwards (`torch.compiler.set_stance("fail_on_recompile")` proves
it in tests/engine/test_compiled_forward.py).

Padding tokens are id 0 at position 0; the paged attention op (`attention_op`)
writes no K/V for them and attends only the step's real tokens, so they
change nothing. The LM head runs eagerly, after the graph, on the kept rows
only (`logits_index`), so neither the number of kept rows nor the padding
reach it: the graph returns the final hidden states.

The weights `engine/cpu/linear.py` packed stay graph inputs (no copy): their
GEMMs are its opaque `pagedinfer::onednn_linear` op inside the graph; inductor
fuses the rest (norms, RoPE, SiLU-and-multiply, residual adds).

Models whose logits are not `lm_head(final hidden state)` (soft-capping,
logit scales) would differ: `warm_up` compares the compiled logits with the
eager model's on one step and refuses (ValueError) if they differ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from pagedinfer.engine.attention import StepContext
from pagedinfer.engine.cpu.attention_op import current_step

logger = logging.getLogger(__name__)


def token_buckets(max_num_batched_tokens: int) -> tuple[int, ...]:
    """Powers of two below max_num_batched_tokens, then max_num_batched_tokens itself."""
    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens: must be >= 1, got {max_num_batched_tokens}")
    buckets = []
    size = 1
    while size < max_num_batched_tokens:
        buckets.append(size)
        size *= 2
    return (*buckets, max_num_batched_tokens)


class CompiledForward:
    """`model`'s forward for the engine's packed steps: compiled decoder per bucket + eager LM head."""

    def __init__(self, model: nn.Module, max_num_batched_tokens: int) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.buckets = token_buckets(max_num_batched_tokens)
        self._compiled = torch.compile(self.decoder, fullgraph=True, dynamic=False)
        self.startup_seconds: float | None = None

    def bucket_for(self, num_tokens: int) -> int:
        for size in self.buckets:
            if num_tokens <= size:
                return size
        raise ValueError(f"a step of {num_tokens} tokens exceeds max_num_batched_tokens = {self.buckets[-1]}")

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: StepContext,
                 logits_index: torch.Tensor) -> torch.Tensor:
        """Logits `[len(logits_index), vocab]` of the packed step `input_ids`/`positions` `[1, num_tokens]`."""
        return self._run(input_ids, positions, ctx, logits_index, self.bucket_for(input_ids.shape[1]))

    def _run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: StepContext, logits_index: torch.Tensor,
             bucket: int) -> torch.Tensor:
        num_tokens = input_ids.shape[1]
        with torch.inference_mode():  # the graph's inputs are always fresh inference tensors: one guard set
            ids = input_ids.new_zeros(1, bucket)
            pos = positions.new_zeros(1, bucket)
            ids[:, :num_tokens] = input_ids
            pos[:, :num_tokens] = positions
            with current_step(ctx):
                hidden = self._compiled(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
            return self.lm_head(hidden[0, logits_index])

    def warm_up(self, one_token_step: Callable[[], tuple[torch.Tensor, torch.Tensor, StepContext]]) -> float:
        """Compile every bucket (one real token padded to it); returns and logs the seconds it took.

        `one_token_step()` gives a fresh one-token step (ids, positions, context) whose K/V
        may be written anywhere unused. The first bucket's logits are checked against the
        eager model's.
        """
        start = time.perf_counter()
        with torch.inference_mode():
            ids, positions, ctx = one_token_step()
            eager = self.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=0,
                               pagedinfer_step=ctx).logits[0]
            for size in self.buckets:
                ids, positions, ctx = one_token_step()
                logits = self._run(ids, positions, ctx, torch.tensor([0]), size)
                if size == self.buckets[0] and not torch.allclose(logits, eager, rtol=1e-3, atol=1e-3):
                    raise ValueError(f"compile: {type(self.model).__name__}'s logits are not its LM head's output"
                                     " on the final hidden state; run it without --compile")
        self.startup_seconds = time.perf_counter() - start
        logger.info("compiled the forward for %d token buckets (%s) in %.1f s", len(self.buckets),
                    ", ".join(map(str, self.buckets)), self.startup_seconds)
        return self.startup_seconds
