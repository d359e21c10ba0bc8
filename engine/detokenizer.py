"""Incremental detokenization that never splits a multi-byte character.

Each new token re-decodes a short window (prefix_offset..end) and emits only
the text past what the window decoded to before the token; if the window
ends in U+FFFD (an incomplete UTF-8 sequence) nothing is emitted until the
next token completes it. The window starts a few prompt tokens back so
tokenizers that drop or add leading spaces decode a word boundary correctly.

`fast_decode` returns a fast tokenizer's own Rust `decode` when the wrapper's
`decode` would call it and nothing else (a class that overrides neither
`decode` nor `_decode`, and no clean-up: we never ask for it): the same text
without the wrapper's Python (two decodes per generated token, 5-7x cheaper
each on a short window; tests/engine/test_detokenizer.py checks the texts are equal).

In the steady state (every token completes its text) the window before the
new token is that one previous token: its text, `decode([id])`, depends on
the id alone, so it is memoised in `pieces` (shared by the detokenizers of
one tokenizer and skip_special_tokens setting) and each token costs one decode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_CONTEXT_TOKENS = 5


def fast_decode(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str] | None:
    """`ids -> tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)` through the
    Rust tokenizer directly, or None where the wrapper might do more than call it (see the module docstring)."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: the wrapper's decode
        return None
    cls = type(tokenizer)
    backend = getattr(tokenizer, "_tokenizer", None)
    if not (
        isinstance(tokenizer, TokenizersBackend)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is TokenizersBackend._decode
        and callable(getattr(backend, "decode", None))
    ):
        return None

    return functools.partial(backend.decode, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        pieces: dict[int, str] | None = None,
    ) -> None:
        """`pieces`: the `decode([id])` memo to share (the same tokenizer and skip_special_tokens only)."""
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._decode = fast_decode(tokenizer, skip_special_tokens) or functools.partial(
            tokenizer.decode, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )
        self.pieces = {} if pieces is None else pieces
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly complete text (maybe empty)."""
        ids = self.ids
        ids.append(token_id)
        if self.read_offset - self.prefix_offset == 1:  # the window before the token is one token: memoised
            last = ids[self.prefix_offset]
            prefix_text = self.pieces.get(last)
            if prefix_text is None:
                prefix_text = self.pieces[last] = self._decode([last])
        else:
            prefix_text = self._decode(ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(ids[self.prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            new_text = full_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            if self.prefix_offset > 64:
                self.ids = self.ids[self.prefix_offset :]
                self.read_offset -= self.prefix_offset
                self.prefix_offset = 0
            return new_text
        return ""
