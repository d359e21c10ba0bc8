"""Stop checks: whether a newly sampled token ends its sequence, decided without its text.

Pure Python, no torch, no engine state: the engine appends the token, advances the sequence's grammar
matcher (structured outputs), then asks `check_stop`. What needs the token's text (stop strings) is the
output side's (`engine/overlap/text.py`), which also decides what an early finish drops from the text.

Invariants: EOS (unless `ignore_eos`) and `stop_token_ids` end a sequence only once it has `min_tokens`
output tokens; the length limit is `min(prompt + max_tokens, max_model_len)` tokens, one comparison
(`Sequence.max_num_tokens`); a grammar's end and the length limit are both "late" (the token is kept), and
the grammar's end wins over the length limit as the reason.
"""

from __future__ import annotations

from collections.abc import Container
from typing import NamedTuple

from pagedinfer.engine.sequence import Sequence


class Stop(NamedTuple):
    """How a new token ends its sequence, if it does (a named tuple: one per sampled token)."""

    early: str | None  # EOS or a stop token ("stop"): decided before any text (the stop text is dropped)
    stop_token: int | None  # the stop token id that ended the sequence (its stop_reason), else None
    late: str | None  # the grammar's end ("stop") or the length limit ("length"): a stop string in the token wins

    @property
    def reason(self) -> str | None:
        """The finish reason the engine applies at once (None: the sequence goes on)."""
        return self.early or self.late


def check_stop(
    seq: Sequence,
    token: int,
    num_tokens: int,
    grammar_ended: bool,
    eos_token_ids: Container[int],
    max_model_len: int,
) -> Stop:
    """The finishes `token`, just appended to seq (now `num_tokens` tokens long, placeholders excluded), decides.

    grammar_ended: seq's grammar allows nothing more, or rejected the token (the output ends with it)."""
    p = seq.params
    num_output_tokens = num_tokens - len(seq.prompt_token_ids)
    early = stop_token = None
    if token in eos_token_ids and not p.ignore_eos and num_output_tokens >= p.min_tokens:
        early = "stop"
    elif p.stop_token_ids and token in p.stop_token_ids and num_output_tokens >= p.min_tokens:
        early, stop_token = "stop", token
    late = "stop" if grammar_ended else None
    if late is None and num_tokens >= min(seq.max_num_tokens, max_model_len):
        late = "length"
    return Stop(early, stop_token, late)
