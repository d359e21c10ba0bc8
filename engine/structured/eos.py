"""The engine's EOS ids as the grammar backend sees them: one id it knows, the others its aliases.

A model may end a completion with any of several ids (the generation
config's `eos_token_id` list, e.g. Llama 3's `<|end_of_text|>` and
`<|eot_id|>`). llguidance's tokenizer takes one EOS id in 1.0.0
(`from_tokenizer(eos_token: int)`: a list is a TypeError, so every
structured request failed) and one or a list from 1.x later. So that one
code path serves every version from the floor up, the backend is given one
id, `primary` (the smallest), and the engine treats the `others` as
aliases of it:

- in a step's grammar mask, each other EOS id is allowed exactly where
  `primary` is, i.e. where the grammar may end, and nowhere else
  (`bitmask.GrammarBitmask.apply` copies `primary`'s column to theirs): the
  engine ends a sequence on any EOS id, so one sampled where the grammar
  cannot end would cut a document short;
- the matcher consumes `primary` when any EOS id is sampled (`for_grammar`),
  so it stops as it would on its own EOS.

Pure Python: no llguidance, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GrammarEos:
    """`primary`: the one EOS id the grammar backend is told (None: no EOS ids, the tokenizer's own is used);
    `others`: the engine's remaining EOS ids, ascending, each standing for `primary`."""

    primary: int | None
    others: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.primary is None and self.others:
            raise ValueError(f"others: {self.others} given without a primary EOS id")
        if self.primary in self.others:
            raise ValueError(f"others: must not repeat the primary EOS id {self.primary}")

    @classmethod
    def of(cls, eos_token_ids: Iterable[int]) -> GrammarEos:
        """The smallest id is the primary (the same choice wherever the engine's EOS set is known)."""
        ids = sorted(set(eos_token_ids))
        return cls(ids[0], tuple(ids[1:])) if ids else cls(None, ())

    def for_grammar(self, token: int) -> int:
        """The id the matcher consumes for a sampled `token`: `primary` for every EOS alias."""
        return self.primary if token in self.others else token

    def aliases_in(self, vocab_size: int) -> tuple[int, ...]:
        """The other EOS ids inside a `vocab_size` mask (an id past the logits is never sampled)."""
        if self.primary is None or self.primary >= vocab_size:
            return ()
        return tuple(t for t in self.others if t < vocab_size)
