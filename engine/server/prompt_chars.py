"""The most characters one token can stand for, read once from the tokenizer's pipeline and vocabulary.

With that bound a prompt can be refused by its length in characters, before
it is tokenized: a text of more than `num_tokens * max_chars_per_token`
characters tokenizes to more than `num_tokens` tokens. Tokenizing 1 MiB of
text takes the better part of a second; measuring it takes nothing.

Why the bound holds. A fast tokenizer runs normalizer -> pre-tokenizer ->
model -> post-processor over the text (c characters):
- The normalizer may shorten the text only by composing characters (NFC,
  NFKC) or by replacing a string with a shorter one. Every code point's
  decomposition is non-empty and NFD(NFC(t)) = NFD(t), so len(NFD(t)) is at
  most len(NFC(t)) times the longest decomposition of one code point, R
  (computed from `unicodedata` over all code points; NFKC likewise with
  NFKD), while len(NFD(t)) >= len(t). Lowercase, Prepend and the
  decompositions never shorten. Strip, StripAccents, BertNormalizer and
  sentencepiece's Precompiled may delete characters without bound: no bound.
- The pre-tokenizers kept here lose no character: ByteLevel (one symbol per
  UTF-8 byte, so at least one per character), Metaspace, Digits,
  UnicodeScripts, and Split / Punctuation that keep the delimiters.
  Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit and a
  "removed" delimiter drop characters: no bound.
- A BPE model turns every symbol into part of exactly one token whose string
  holds at least that many symbols (a byte-fallback token `<0xE3>` stands
  for one byte), so a token stands for at most M symbols, M being the
  longest token string in the vocabulary. That needs every symbol to come
  out as some token. A symbol not in the vocabulary becomes its UTF-8 bytes
  (`byte_fallback`, when all 256 `<0xXX>` tokens exist), else one unk token,
  unless `fuse_unk` merges a run of them into one: no bound. Without an unk
  token it is silently dropped (440 characters of 'Ω' were 1 token), so a
  BPE without one is bounded only where no symbol can be unknown: a
  ByteLevel pre-tokenizer, whose 256 symbols are all in the vocabulary.
  WordPiece, Unigram and WordLevel map a whole word to one [UNK]: no bound.
- An added token matched in the text stands for its content; one with
  lstrip/rstrip also swallows the whitespace around it without bound: no
  bound.
- The post-processor only adds tokens (BOS, EOS).
So the text has at least c / (R * M) tokens, with M also covering the added
tokens' contents. Anything not recognised here gives None (no pre-check;
tokenization still runs off the event loop).
"""

from __future__ import annotations

import functools
import json
import sys
import unicodedata
from typing import Any

_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}
_KEEPING_BEHAVIOURS = {"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"}  # all but "Removed"
_NON_SHORTENING_NORMALIZERS = {"NFD", "NFKD", "Lowercase", "Prepend"}


@functools.cache
def longest_decomposition(form: str) -> int:
    """The most code points one code point decomposes to under `form` ("NFD" or "NFKD")."""
    longest = 1
    for code_point in range(sys.maxunicode + 1):
        if 0xD800 <= code_point <= 0xDFFF:
            continue  # surrogates are not characters of any text the server accepts
        longest = max(longest, len(unicodedata.normalize(form, chr(code_point))))
    return longest


def _normalizer_shrink(normalizer: dict | None) -> int | None:
    """How many times shorter the normalizer can make a text at most (None: without bound)."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1
        for step in normalizer.get("normalizers", []):
            step_factor = _normalizer_shrink(step)
            if step_factor is None:
                return None
            factor *= step_factor
        return factor
    if kind in _NON_SHORTENING_NORMALIZERS:
        return 1
    if kind in ("NFC", "NFKC"):
        return longest_decomposition("NFD" if kind == "NFC" else "NFKD")
    if kind == "Replace":
        pattern = normalizer.get("pattern", {}).get("String")
        content = normalizer.get("content", "")
        if pattern is None or not content:
            return None  # a regex or an empty replacement can delete text without bound
        return max(1, -(-len(pattern) // len(content)))
    return None


def _pre_tokenizer_keeps_every_character(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps_every_character(p) for p in pre_tokenizer.get("pretokenizers", []))
    if kind in _KEEPING_PRE_TOKENIZERS:
        return True
    if kind in ("Split", "Punctuation"):
        return pre_tokenizer.get("behavior", "Isolated") in _KEEPING_BEHAVIOURS
    return False


def _has_byte_level(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_has_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))
    return pre_tokenizer.get("type") == "ByteLevel"


def _every_symbol_is_a_token(model: dict, pre_tokenizer: dict | None) -> bool:
    """A BPE model turns each symbol it cannot merge into at least one token of its own (none dropped or fused)."""
    vocab = model.get("vocab") or {}
    if model.get("byte_fallback") and all(f"<0x{b:02X}>" in vocab for b in range(256)):
        return True  # an unknown symbol becomes one token per UTF-8 byte
    if model.get("unk_token") is not None:
        return not model.get("fuse_unk")  # one unk per unknown symbol (an unk missing from vocab is an error)
    from tokenizers import pre_tokenizers

    return _has_byte_level(pre_tokenizer) and all(c in vocab for c in pre_tokenizers.ByteLevel.alphabet())


def max_chars_per_token(tokenizer: Any) -> int | None:
    """The most characters of input text one token stands for; None where no sound bound is known."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None  # a slow (Python) tokenizer: its pipeline is not declared
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not _every_symbol_is_a_token(model, spec.get("pre_tokenizer")):
        return None
    shrink = _normalizer_shrink(spec.get("normalizer"))
    if shrink is None or not _pre_tokenizer_keeps_every_character(spec.get("pre_tokenizer")):
        return None
    added = spec.get("added_tokens") or []
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None
    longest_token = max(
        [len(piece) for piece in model.get("vocab", {})] + [len(t["content"]) for t in added], default=1
    )
    return shrink * max(1, longest_token)
