"""Prompts too long for max_model_len are refused by their length in characters, before tokenizing,
from a bound read off the tokenizer, so refusing huge prompts does not hold up small requests."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving_harness import start_server, stop_server

from pagedinfer.engine.server.prompt_chars import longest_decomposition, max_chars_per_token

CORPUS = ["the quick brown fox jumps over the lazy dog", "naïve café déjà vu", "東京 大阪 名古屋", "x = [1, 2, 3]"]
PIECES = ["<s>", "</s>", "<|user|>", " ", "  ", "e\u0301", "\u1100\u1161\u11a8", "ﬁ", "🙂", "the", "東"]
TEXTS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200) | st.lists(
    st.sampled_from(PIECES), max_size=60
).map("".join)


def _fast_tokenizer(normalizer=None, pre_tokenizer=None, model=None, added=()):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(model or models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    if isinstance(tok.model, models.BPE):
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    for token in added:
        tok.add_special_tokens([token])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def _assert_sound(tokenizer, text: str) -> None:
    bound = max_chars_per_token(tokenizer)
    num_tokens = len(tokenizer.encode(text, add_special_tokens=False))
    assert num_tokens * bound >= len(text), (text, num_tokens, bound)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama))


@pytest.fixture(scope="module")
def nfc_tokenizer():
    from tokenizers import normalizers

    return _fast_tokenizer(normalizer=normalizers.NFC())


@given(text=TEXTS)
@settings(max_examples=300, deadline=None)
def test_the_bound_holds_for_the_byte_level_tokenizer(tiny_tokenizer, text):
    _assert_sound(tiny_tokenizer, text)


@given(text=TEXTS)
@settings(max_examples=300, deadline=None)
def test_the_bound_holds_for_a_composing_normalizer(nfc_tokenizer, text):
    _assert_sound(nfc_tokenizer, text)


def test_the_bound_is_the_longest_token_times_the_longest_decomposition(tiny_tokenizer, nfc_tokenizer):
    longest = max(len(piece) for piece in tiny_tokenizer.get_vocab())
    assert max_chars_per_token(tiny_tokenizer) == longest
    assert longest_decomposition("NFD") > 1
    nfc_longest = max(len(piece) for piece in nfc_tokenizer.get_vocab())
    assert max_chars_per_token(nfc_tokenizer) == nfc_longest * longest_decomposition("NFD")


def test_tokenizers_that_can_drop_text_have_no_bound():
    from tokenizers import AddedToken, models, normalizers, pre_tokenizers

    dropping = [
        _fast_tokenizer(pre_tokenizer=pre_tokenizers.Whitespace()),  # whitespace is dropped
        _fast_tokenizer(normalizer=normalizers.Strip()),
        _fast_tokenizer(normalizer=normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()])),
        _fast_tokenizer(normalizer=normalizers.Replace(" ", "")),
        _fast_tokenizer(pre_tokenizer=pre_tokenizers.Split(" ", "removed")),
        _fast_tokenizer(
            model=models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"),
            pre_tokenizer=pre_tokenizers.WhitespaceSplit(),
        ),  # one [UNK] per unknown word
        _fast_tokenizer(model=models.BPE(unk_token="<unk>", fuse_unk=True)),
        _fast_tokenizer(added=[AddedToken("<mask>", lstrip=True)]),  # swallows the spaces before it
    ]
    assert [max_chars_per_token(t) for t in dropping] == [None] * len(dropping)
    spaces = dropping[0]
    assert len(spaces.encode(" " * 10_000 + "a", add_special_tokens=False)) <= 2  # why: no bound could hold


def test_a_bpe_without_an_unk_token_is_bounded_only_if_no_symbol_can_be_unknown():
    """Without an unk token, BPE drops a symbol it does not know: 440 characters can be one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    metaspace = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, "\u2581": 3}, merges=[("a", "b")]))
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    partial_bytes = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    partial_bytes.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    dropping = [PreTrainedTokenizerFast(tokenizer_object=t) for t in (metaspace, partial_bytes)]
    assert len(dropping[0].encode("\u03a9" * 440, add_special_tokens=False)) <= 1  # why a bound cannot hold
    assert dropping[1].encode("z" * 100, add_special_tokens=False) == []
    assert [max_chars_per_token(t) for t in dropping] == [None, None]
    whole_alphabet = _fast_tokenizer(model=models.BPE())  # byte-level, as GPT-2, Llama 3 and Qwen: no unk needed
    assert max_chars_per_token(whole_alphabet) is not None
    for text in CORPUS + ["\u03a9" * 440, "\U0001f642 " * 50]:
        _assert_sound(whole_alphabet, text)


@pytest.fixture(scope="module")
def roomy_server(tiny_llama):
    running = start_server(tiny_llama, max_request_body_bytes=4 << 20)  # 1 MiB prompts reach the server
    yield running
    stop_server(running)


MIB_PROMPT = "hello world " * ((1 << 20) // 12)


def test_a_prompt_longer_than_max_model_len_tokens_can_hold_is_refused_by_its_length(roomy_server):
    info = roomy_server.engine_loop.info
    assert info.max_prompt_chars == (info.max_model_len - 1) * max_chars_per_token(info.tokenizer)
    r = httpx.post(
        roomy_server.url + "/v1/completions",
        timeout=60,
        json={"model": "tiny", "prompt": ["hi", MIB_PROMPT], "max_tokens": 2},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert f"{len(MIB_PROMPT)} characters" in error["message"] and str(info.max_prompt_chars) in error["message"]
    chat = httpx.post(
        roomy_server.url + "/v1/chat/completions",
        timeout=60,
        json={"model": "tiny", "messages": [{"role": "user", "content": MIB_PROMPT}]},
    )
    assert chat.status_code == 400, chat.text
    assert chat.json()["error"]["param"] == "messages"
    assert "characters" in chat.json()["error"]["message"]
    just_fits = "a" * info.max_prompt_chars  # refused too, but only once tokenized: the bound is not a guess
    r = httpx.post(
        roomy_server.url + "/v1/completions", timeout=60, json={"model": "tiny", "prompt": just_fits, "max_tokens": 1}
    )
    assert r.status_code == 400 and "tokens" in r.json()["error"]["message"], r.text


def _small_request_seconds(url: str) -> float:
    started = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text
    return time.perf_counter() - started


def test_a_small_request_is_not_held_up_while_huge_prompts_are_refused(roomy_server):
    """8 clients keep sending 1 MiB prompts; a 2-token request stays within a small multiple of its latency alone.

    Before the length check, each huge prompt was tokenized (on one shared
    thread) only to be refused, and the small request queued behind them:
    5.9 s instead of 30 ms. The bound (20x, or 1 s over) is generous for a
    loaded 2-core machine and far below what queueing behind them costs.
    """
    url = roomy_server.url
    alone = statistics.median(_small_request_seconds(url) for _ in range(7))
    stop = threading.Event()
    refused: list[int] = []

    def flood() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                r = client.post(url + "/v1/completions", json={"model": "tiny", "prompt": MIB_PROMPT})
                refused.append(r.status_code)

    flooders = [threading.Thread(target=flood) for _ in range(8)]
    for f in flooders:
        f.start()
    try:
        while len(refused) < 8:
            time.sleep(0.05)
        loaded = statistics.median(_small_request_seconds(url) for _ in range(7))
    finally:
        stop.set()
        for f in flooders:
            f.join(120)
    assert set(refused) == {400}
    print(
        f"2-token request alone {alone * 1000:.0f} ms, while 1 MiB prompts are refused {loaded * 1000:.0f} ms "
        f"({loaded / alone:.1f}x; {len(refused)} refused)"
    )
    assert loaded < max(20 * alone, alone + 1.0)
