"""The model's decoder compiled with torch.compile (inductor, CPU): one graph for every step size.

A step's packed token count varies from 1 to max_num_batched_tokens. The
decoder is compiled once with that count as a symbolic dimension
(`torch._dynamo.mark_dynamic` on the ids and positions), so one graph serves
every count and start-up compiles once (`warm_up`), instead of once per
static size (the earlier design: ten power-of-two buckets, about 20 s each
for the 125M model). No step compiles after warm-up
(`torch.compiler.set_stance("fail_on_recompile")` proves it in
tests/engine/test_compiled_forward.py).

Dynamo specialises a dimension of size 1 (a graph traced with a symbolic
size assumes it is not 0 or 1), so a one-token step (a single sequence
decoding) is padded to `MIN_TOKENS` = 2: the padding token is id 0 at
position 0; the paged attention op (`attention_op`) writes no K/V for it and
attends only the step's real tokens, so it changes nothing. The LM head runs
eagerly, after the graph, on the kept rows only (`logits_index`), so neither
the number of kept rows nor the padding reach it: the graph returns the final
hidden states.

The weights `engine/cpu/linear.py` packed stay graph inputs (no copy): their
GEMMs (q/k/v and gate/up fused by `fused_projections` first) are its opaque
`pagedinfer::onednn_linear` op inside the graph; inductor fuses the rest
(norms, RoPE, SiLU-and-multiply, residual adds).

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

from pagedinfer.contracts import validators
from pagedinfer.engine.attention import StepContext
from pagedinfer.engine.cpu.attention_op import current_step

logger = logging.getLogger(__name__)

MIN_TOKENS = 2  # the graph's smallest token count: a one-token step is padded to it


def logits_agree(compiled: torch.Tensor, eager: torch.Tensor) -> bool:
    """Whether the compiled forward's logits are the eager model's up to rounding: 1e-3 in float32; in a
    16-bit dtype 10% of the largest |logit| (inductor keeps norms and activations in float32 where eager
    rounds each op to bfloat16: 2.8% on the 125M bench model's first step). A logit scale the graph left
    out (0.0625, 0.125 in the models that have one) differs by far more."""
    if eager.dtype == torch.float32:
        return torch.allclose(compiled, eager, rtol=1e-3, atol=1e-3)
    scale = eager.float().abs().max().item()
    return torch.allclose(compiled.float(), eager.float(), rtol=0.0, atol=0.1 * scale + 1e-3)


class CompiledForward:
    """`model`'s forward for the engine's packed steps: the compiled decoder (one graph) + the eager LM head."""

    def __init__(self, model: nn.Module, max_num_batched_tokens: int) -> None:
        validators.positive_int("max_num_batched_tokens", max_num_batched_tokens)
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.max_num_batched_tokens = max_num_batched_tokens
        self._compiled = torch.compile(self.decoder, fullgraph=True)
        self._traced = False  # the first call marks the token count symbolic; dynamo traces it then
        self.startup_seconds: float | None = None

    def padded_size(self, num_tokens: int) -> int:
        """The token count the graph runs a step of `num_tokens` at."""
        if num_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"a step of {num_tokens} tokens exceeds max_num_batched_tokens = {self.max_num_batched_tokens}"
            )
        return max(num_tokens, MIN_TOKENS)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: StepContext, logits_index: torch.Tensor
    ) -> torch.Tensor:
        """Logits `[len(logits_index), vocab]` of the packed step `input_ids`/`positions` `[1, num_tokens]`."""
        num_tokens = input_ids.shape[1]
        size = self.padded_size(num_tokens)
        with torch.inference_mode():  # the graph's inputs are always fresh inference tensors: one guard set
            ids = input_ids.new_zeros(1, size)
            pos = positions.new_zeros(1, size)
            ids[:, :num_tokens] = input_ids
            pos[:, :num_tokens] = positions
            if not self._traced:  # a symbolic size's range must hold two values at least
                largest = max(self.max_num_batched_tokens, MIN_TOKENS + 1)
                torch._dynamo.mark_dynamic(ids, 1, min=MIN_TOKENS, max=largest)
                torch._dynamo.mark_dynamic(pos, 1, min=MIN_TOKENS, max=largest)
                self._traced = True
            with current_step(ctx):
                hidden = self._compiled(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
            return self.lm_head(hidden[0, logits_index])

    def warm_up(self, one_token_step: Callable[[], tuple[torch.Tensor, torch.Tensor, StepContext]]) -> float:
        """Compile the graph on one real token (padded); returns and logs the seconds it took.

        `one_token_step()` gives a fresh one-token step (ids, positions, context) whose K/V
        may be written anywhere unused. The compiled logits are checked against the eager model's.
        """
        start = time.perf_counter()
        with torch.inference_mode():
            ids, positions, ctx = one_token_step()
            eager = self.model(
                input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=0, pagedinfer_step=ctx
            ).logits[0]
            ids, positions, ctx = one_token_step()
            logits = self(ids, positions, ctx, torch.tensor([0]))
            if not logits_agree(logits, eager):
                raise ValueError(
                    f"compile: {type(self.model).__name__}'s logits are not its LM head's output"
                    " on the final hidden state; run it without --compile"
                )
        self.startup_seconds = time.perf_counter() - start
        logger.info(
            "compiled the forward (one graph, 1 to %d tokens) in %.1f s",
            self.max_num_batched_tokens,
            self.startup_seconds,
        )
        return self.startup_seconds
