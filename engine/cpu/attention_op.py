"""The paged attention of one layer as a torch custom op, so a compiled forward can call it.

`torch.compile` cannot trace the paged attention itself: its metadata carries
host lists (per-sequence lengths) that would become guards, recompiling at
every step. Inside a compiled graph, transformers' attention call
(engine/attention.py) becomes ONE opaque op, `pagedinfer::paged_attention`,
whose fake implementation gives only the output's shape; at run time its real
implementation writes the step's K/V and attends through the dispatch
(`kernels.dispatch.write_kv` / `paged_attention`: the torch reference, or
whatever native kernel replaces it there), exactly as the eager path does.

The step's state (metadata, caches) cannot be an op argument, so the compiled
forward publishes it for the duration of one forward with `current_step`
(a ContextVar, as vLLM's forward context): the op reads it at run time, never
at trace time. The op's query may hold padding rows past the step's real
tokens (the compiled forward pads a one-token step to two): only the
first `num_tokens` rows are written to the cache and attended; the padding
rows come back as zeros and their logits are dropped by the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pagedinfer.engine.attention import StepContext

_CURRENT: ContextVar[StepContext | None] = ContextVar("pagedinfer_compiled_step", default=None)


@contextmanager
def current_step(ctx: StepContext) -> Iterator[None]:
    """Publish `ctx` to the attention op for one forward."""
    token = _CURRENT.set(ctx)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@torch.library.custom_op("pagedinfer::paged_attention", mutates_args=())
def paged_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: int, scale: float, sliding_window: int | None
) -> torch.Tensor:
    """transformers' layout in ([1, heads, tokens, head_dim]), `[1, tokens, heads, v_head_dim]` out."""
    from pagedinfer.engine.attention import attend_layer

    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError("pagedinfer::paged_attention ran outside a compiled step (no current_step)")
    num_tokens = ctx.metadata.num_tokens
    out = attend_layer(
        ctx,
        layer,
        query[..., :num_tokens, :],
        key[..., :num_tokens, :],
        value[..., :num_tokens, :],
        scale,
        sliding_window,
    )
    padding = query.shape[2] - num_tokens
    if padding:
        out = torch.cat([out, out.new_zeros(1, padding, *out.shape[2:])], dim=1)
    return out


@paged_attention.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer: int, scale: float, sliding_window: int | None
) -> torch.Tensor:
    return query.new_empty(1, query.shape[2], query.shape[1], value.shape[3])
