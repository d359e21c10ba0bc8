"""Chat logprobs' `bytes` are each token's own bytes, also for a token that holds part of a character."""

from __future__ import annotations

import httpx
import pytest

from pagedinfer.engine.outputs import Logprob
from pagedinfer.engine.server.responses import chat_logprobs
from pagedinfer.engine.server.token_bytes import token_bytes

REPLACEMENT = list("\ufffd".encode())  # [239, 191, 189]: what the bytes of a partial token must not be
TEXT = "東京🙂 naïve"


@pytest.fixture(scope="module")
def byte_level_tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama))


@pytest.fixture(scope="module")
def byte_fallback_tokenizer():
    """A sentencepiece-style BPE (Metaspace, byte fallback), as Llama 2's, built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("▁", "n", "a", "ï", "v", "e", "▁n", "▁na"):
        vocab[piece] = len(vocab)
    merges = [("▁", "n"), ("▁n", "a")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


@pytest.mark.parametrize("name", ["byte_level_tokenizer", "byte_fallback_tokenizer"])
def test_the_tokens_bytes_join_into_the_texts_utf8(name, request):
    tokenizer = request.getfixturevalue(name)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    texts = [tokenizer.decode([i]) for i in ids]
    assert "\ufffd" in texts  # some token holds part of a multi-byte character
    joined = b"".join(token_bytes(tokenizer, i, t) for i, t in zip(ids, texts))
    assert joined.decode("utf-8").replace(" ", "") == TEXT.replace(" ", "")  # sentencepiece spells spaces as ▁
    partial = ids[texts.index("\ufffd")]
    entry = chat_logprobs(tokenizer, [partial], [{partial: Logprob(-0.5, 1)}], k=1)["content"][0]
    assert entry["token"] == "\ufffd"
    assert entry["bytes"] == list(token_bytes(tokenizer, partial, "\ufffd")) != REPLACEMENT
    assert len(entry["bytes"]) == 1 and entry["bytes"][0] >= 0x80
    assert entry["top_logprobs"][0]["bytes"] == entry["bytes"]


def test_the_server_reports_partial_tokens_bytes(server):
    """The tiny model's vocabulary is mostly single bytes: its top 20 always include some above 0x7F."""
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "東京"}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 20,
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    entries = [e for token in r.json()["choices"][0]["logprobs"]["content"] for e in [token, *token["top_logprobs"]]]
    partial = [e for e in entries if e["token"] == "\ufffd"]
    assert partial, "no partial token among the top 20: pick another prompt"
    assert all(e["bytes"] != REPLACEMENT and len(e["bytes"]) == 1 for e in partial), partial[:3]
    whole = [e for e in entries if "\ufffd" not in e["token"]]
    assert all(bytes(e["bytes"]).decode("utf-8") == e["token"] for e in whole)
