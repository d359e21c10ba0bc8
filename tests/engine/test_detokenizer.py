"""Incremental detokenization never splits a multi-byte character."""

from pagedinfer.engine.detokenizer import IncrementalDetokenizer
from pagedinfer.engine.tiny_model import train_tokenizer


def test_streamed_text_equals_full_decode_and_has_no_broken_characters(tmp_path):
    tok = train_tokenizer(tmp_path)
    text = "café 東京 😀 naïve ∑ hello world"
    ids = tok(text).input_ids
    # Byte-level BPE splits the emoji and CJK characters over several tokens.
    assert len(ids) > len(text.split())
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    pieces = [detok.add(t) for t in ids]
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
