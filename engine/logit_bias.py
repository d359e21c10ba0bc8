"""OpenAI's `logit_bias`, applied to a whole step's logits in one scatter.

Each row's bias (token id -> value in [-100, 100]) is added to that row's
logits before penalties, temperature and cuts, so +100 all but forces a
token and -100 all but bans it, as OpenAI documents. Rows without a bias are
untouched; the rows with one cost one index_put_ together, not one per row.
"""

from __future__ import annotations

import torch

from pagedinfer.engine.sequence import Sequence


def apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Add each sequence's logit_bias to its row of logits [len(seqs), vocab], in place."""
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for row, seq in enumerate(seqs):
        for token, bias in (seq.params.logit_bias or {}).items():
            rows.append(row)
            cols.append(token)
            values.append(bias)
    if not rows:
        return
    index = torch.tensor([rows, cols], dtype=torch.long, device=logits.device)
    logits.index_put_(
        (index[0], index[1]), torch.tensor(values, dtype=logits.dtype, device=logits.device), accumulate=True
    )
