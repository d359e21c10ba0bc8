"""A token's raw bytes, for the `bytes` of OpenAI's chat logprobs.

OpenAI gives each logprob entry the UTF-8 bytes of its token, so a client
can join the bytes of consecutive tokens into a character that spans them. A
token that holds only part of a multi-byte character decodes to U+FFFD on
its own; its `bytes` must be its own (e.g. [0xE6]), not U+FFFD's
([0xEF, 0xBF, 0xBD]). They are read from the token's vocabulary string:
- byte-level BPE (GPT-2, Llama 3, Qwen; the tokenizer's decoder is
  ByteLevel): the string spells one byte per character through GPT-2's
  reversible map, in which the printable Latin-1 bytes ('!'..'~', '¡'..'¬',
  '®'..'ÿ') stand for themselves and the other 68, in byte order, for
  U+0100 onwards;
- byte fallback (sentencepiece: Llama 2, Mistral; the decoder has
  ByteFallback): `<0x00>`..`<0xFF>` stand for one byte each.
Otherwise, and for every token whose text decodes cleanly, the bytes are the
UTF-8 of its text.
"""

from __future__ import annotations

import json
import re
import weakref
from typing import Any

_BYTE_FALLBACK_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_decoder_kinds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _printable_byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: character -> the byte it spells."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(0x100 + i): b for i, b in enumerate(shifted)})
    return table


_BYTE_LEVEL_CHARS = _printable_byte_level_chars()


def _decoder_kind(tokenizer: Any) -> str | None:
    """ "byte_level", "byte_fallback" or None, from the fast tokenizer's declared decoder (cached)."""
    try:
        return _decoder_kinds[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = json.loads(backend.to_str()).get("decoder") if backend is not None else None
    steps = (decoder or {}).get("decoders", [decoder]) if decoder else []
    kinds = {step.get("type") for step in steps if step}
    kind = "byte_level" if "ByteLevel" in kinds else "byte_fallback" if "ByteFallback" in kinds else None
    try:
        _decoder_kinds[tokenizer] = kind
    except TypeError:
        pass
    return kind


def token_bytes(tokenizer: Any, token_id: int, text: str) -> bytes:
    """The raw bytes of token_id, whose text on its own is `text`."""
    if "\ufffd" not in text:
        return text.encode("utf-8")
    kind = _decoder_kind(tokenizer)
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if kind == "byte_level" and isinstance(piece, str) and all(c in _BYTE_LEVEL_CHARS for c in piece):
        return bytes(_BYTE_LEVEL_CHARS[c] for c in piece)
    if kind == "byte_fallback" and isinstance(piece, str):
        match = _BYTE_FALLBACK_TOKEN.fullmatch(piece)
        if match:
            return bytes([int(match.group(1), 16)])
    return text.encode("utf-8")
