"""The router tokenizes exactly as the engine's server does (that it imports no torch nor transformers is an
import-linter contract, pyproject.toml [tool.importlinter], run by tests/test_lint.py)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from pagedinfer.contracts.embedded_model import default_model_dir
from pagedinfer.router.request_tokens import RequestTokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there, how are you?"},
    {"role": "assistant", "content": "Fine."},
    {"role": "user", "content": [{"type": "text", "text": "x"}]},
]


@pytest.mark.parametrize("which", ["embedded", "tiny"])
def test_router_token_ids_equal_the_engine_tokenizers(which, tiny_llama):
    directory = str(default_model_dir() if which == "embedded" else tiny_llama)
    ours, theirs = RequestTokenizer(directory), AutoTokenizer.from_pretrained(directory)
    for text in ("hello world", "  spaces\tand\nnewlines ", "ünïcödé ✓"):
        assert ours.prompt_ids({"prompt": text}, chat=False) == theirs.encode(text, add_special_tokens=True)
    if theirs.chat_template:
        engine_messages = [{**m, "content": m["content"] if isinstance(m["content"], str) else "x"} for m in MESSAGES]
        text = theirs.apply_chat_template(engine_messages, add_generation_prompt=True, tokenize=False)
        assert ours.prompt_ids({"messages": MESSAGES}, chat=True) == theirs.encode(text, add_special_tokens=False)
    assert ours.prompt_ids({"prompt": [5, 6, 7]}, chat=False) == [5, 6, 7]
    assert ours.prompt_ids({"prompt": ""}, chat=False) is None
