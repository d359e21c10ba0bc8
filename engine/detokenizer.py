"""Incremental detokenization that never splits a multi-byte character.

Each new token re-decodes a short window (prefix_offset..end) and emits only
the text past what the window decoded to before the token; if the window
ends in U+FFFD (an incomplete UTF-8 sequence) nothing is emitted until the
next token completes it. The window starts a few prompt tokens back so
tokenizers that drop or add leading spaces decode a word boundary correctly.
"""

from __future__ import annotations

from typing import Any

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly complete text (maybe empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset:])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            new_text = full_text[len(prefix_text):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            if self.prefix_offset > 64:
                self.ids = self.ids[self.prefix_offset:]
                self.read_offset -= self.prefix_offset
                self.prefix_offset = 0
            return new_text
        return ""
