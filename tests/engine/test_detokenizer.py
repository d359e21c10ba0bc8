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


def test_fast_decode_is_the_rust_tokenizer_and_equals_the_wrappers_decode(tmp_path):
    """The per-token decode skips transformers' wrapper only where that changes nothing: same text,
    special tokens kept or skipped alike; a tokenizer class with its own decode keeps the wrapper's."""
    from pagedinfer.engine.detokenizer import fast_decode

    tok = train_tokenizer(tmp_path)
    ids = tok("café 東京 😀 naïve ∑ hello world").input_ids
    ids = [tok.eos_token_id, *ids, tok.eos_token_id] if tok.eos_token_id is not None else ids
    for skip in (True, False):
        decode = fast_decode(tok, skip)
        assert decode is not None
        for end in range(1, len(ids) + 1):
            window = ids[max(0, end - 6) : end]
            assert decode(window) == tok.decode(window, skip_special_tokens=skip, clean_up_tokenization_spaces=False)

    class OwnDecode(type(tok)):
        def decode(self, *args, **kwargs):
            return "x"

    tok.__class__ = OwnDecode
    assert fast_decode(tok, True) is None


def test_a_shared_piece_memo_streams_each_text_as_its_full_decode(tmp_path):
    """The `decode([id])` memo shared by the engine's detokenizers (one per skip_special_tokens): streams of
    different prompts and texts through one memo each equal their full decode, and the memo was used."""
    tok = train_tokenizer(tmp_path)
    pieces: dict[int, str] = {}
    for prompt, text in [
        ("hello", "naïve café hello world"),
        ("東京", "world 😀 hello naïve"),
        ("x", "hello hello world world"),
    ]:
        ids = tok(text).input_ids
        detok = IncrementalDetokenizer(tok, tok(prompt).input_ids, skip_special_tokens=True, pieces=pieces)
        assert "".join(detok.add(t) for t in ids) == tok.decode(ids)
    assert pieces and all(pieces[t] == tok.decode([t]) for t in pieces)
