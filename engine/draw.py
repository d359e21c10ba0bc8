"""The sampler's draw of a batch of rows: temperature, top-k, top-p, min-p, then inverse-CDF sampling.

`draw_columns` packs the rows' options into ONE host tensor moved to the device
in one transfer (pinned and non-blocking on CUDA: no stream sync); `draw`
then works on device tensors only, every row at once, with no host sync and
no branch on a tensor's value (the branches read host-side summaries: is any
row cut by top-k, top-p, min-p). Semantics (the sampler's, `engine/sampler.py`):

Each row's result depends on that row alone (its logits, options and
uniform), never on what else shares the step: every cut ends in vocabulary
order, and the draw is inverse-CDF sampling over the kept probabilities in
vocabulary order, with one uniform per row. Top-k masks below the k-th largest
value; top-p masks below the smallest probability of the shortest descending
prefix reaching p (ranking only the top k when the widest top-k of the rows
asking for top-p is below the vocabulary). Both cut at a value, so ties are
kept and the order a sort gives equal values never matters. A row whose
distribution is empty or not finite (every token masked, overflow) takes the
argmax of its logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedinfer.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class DrawColumns:
    """The options of n rows as `[n, 1]` device columns, and what the host knows of them."""

    temperature: torch.Tensor  # float32 [n, 1]
    top_k: torch.Tensor  # int64 [n, 1], the vocabulary size for a row without one
    top_p: torch.Tensor  # float32 [n, 1], 1.0 for a row without one
    min_p: torch.Tensor  # float32 [n, 1]
    rows: torch.Tensor  # int64 [n], the rows' indices in the step's logits (`draw_columns(rows=...)`)
    any_top_k: bool  # some row has a top-k below the vocabulary size
    widest_top_k: int  # the largest top-k (the vocabulary size when a row has none)
    widest_top_p_top_k: int  # the largest top-k among the rows asking for top-p (0 when none does)
    any_min_p: bool


def draw_columns(
    params: list[SamplingParams], vocab: int, device: torch.device, rows: list[int] | None = None
) -> DrawColumns:
    """`params`' options (and their `rows`, default 0..n-1) on `device` in one host-to-device transfer."""
    top_k = [p.top_k if p.top_k is not None and p.top_k < vocab else vocab for p in params]
    host = torch.tensor(
        [
            [p.temperature for p in params],
            top_k,
            [p.top_p for p in params],
            [p.min_p for p in params],
            rows if rows is not None else range(len(params)),
        ],
        dtype=torch.float64,
    )  # exact for ids and top-k below 2**53
    if device.type == "cuda":
        host = host.pin_memory()
    packed = host.to(device, non_blocking=True)
    widest_top_p = max((k for k, p in zip(top_k, params) if p.top_p < 1.0), default=0)
    return DrawColumns(
        temperature=packed[0, :, None].float(),
        top_k=packed[1, :, None].long(),
        top_p=packed[2, :, None].float(),
        min_p=packed[3, :, None].float(),
        rows=packed[4].long(),
        any_top_k=min(top_k, default=vocab) < vocab,
        widest_top_k=max(top_k, default=vocab),
        widest_top_p_top_k=widest_top_p,
        any_min_p=max((p.min_p for p in params), default=0.0) > 0.0,
    )


def draw(rows: torch.Tensor, columns: DrawColumns, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of float32 `rows` `[n, vocab]` (see the module docstring); `uniforms` `[n]` in [0, 1)."""
    vocab = rows.shape[1]
    scaled = rows / columns.temperature
    if columns.any_top_k:
        largest = torch.topk(scaled, columns.widest_top_k, dim=-1).values
        kth = largest.gather(1, columns.top_k - 1)
        kth = kth.masked_fill(columns.top_k >= vocab, float("-inf"))  # rows without a top-k keep all
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if columns.widest_top_p_top_k:
        # a row cut by top-k has at most k non-zero probabilities: the largest k are all it has
        ranked = (
            torch.topk(probs, columns.widest_top_p_top_k, dim=-1).values
            if columns.widest_top_p_top_k < vocab
            else torch.sort(probs, dim=-1, descending=True).values
        )
        kept = (torch.cumsum(ranked, dim=-1) - ranked <= columns.top_p).sum(-1)
        smallest_kept = ranked.gather(1, kept[:, None].clamp(min=1) - 1)
        cut = probs.masked_fill(probs < smallest_kept, 0.0)
        probs = torch.where(columns.top_p < 1.0, cut, probs)  # rows without top-p are left as they are
    if columns.any_min_p:
        probs = probs.masked_fill(probs < columns.min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    cumulative = torch.cumsum(probs, dim=-1)
    target = uniforms[:, None] * cumulative[:, -1:]
    picked = torch.searchsorted(cumulative, target, right=True)
    # rounding may put the target at the very total: take the last token still kept, never a masked one
    positions = torch.arange(vocab, device=rows.device)
    last_kept = torch.where(probs > 0, positions, 0).amax(dim=-1, keepdim=True)
    drawn = torch.minimum(picked, last_kept)
    usable = torch.isfinite(probs).all(dim=-1, keepdim=True) & (cumulative[:, -1:] > 0)
    return torch.where(usable, drawn, rows.argmax(dim=-1, keepdim=True))[:, 0]
