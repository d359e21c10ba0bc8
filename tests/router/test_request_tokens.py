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


TOOLS_TEMPLATE = (
    "{%- if tools %}<tools>{{ tools | tojson }}</tools>{% endif -%}"
    "{%- if documents is defined and documents is none %}<nodocs>{% endif -%}"
    "{%- for m in messages -%}"
    "<{{ m.role }}{% if m.name %} name={{ m.name }}{% endif %}{% if m.tool_call_id %} for={{ m.tool_call_id }}{% endif %}>"
    "{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}[{{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor -%}"
    "</{{ m.role }}>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<assistant>{% endif -%}"
)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
TOOL_HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Oslo?"}]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
]


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "none"}, {"tools": [TOOL], "tool_choice": "required"}],
    ids=["no-tools", "tools", "tool-choice-none", "tool-choice-required"],
)
def test_router_token_ids_equal_the_servers_for_tools_and_tool_calls(extra, tmp_path):
    """The router builds the template's inputs as the engine's server does (contracts/chat_template.py):
    tool calls with their arguments as objects, the tool message's name and call, the tools unless
    tool_choice is "none", and transformers' `documents`."""
    from types import SimpleNamespace

    from pagedinfer.engine.server.protocol import ChatCompletionRequest
    from pagedinfer.engine.server.serving import Serving

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text((default_model_dir() / name).read_text())
    (tmp_path / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    body = {"model": "m", "messages": TOOL_HISTORY, **extra}
    engine_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    text = Serving.render_chat(SimpleNamespace(tokenizer=engine_tokenizer), ChatCompletionRequest.model_validate(body))
    assert "[call_1 get_weather {" in text and "<tool name=get_weather for=call_1>" in text
    assert ("<tools>" in text) == (extra.get("tools") is not None and extra.get("tool_choice") != "none")
    expected = engine_tokenizer.encode(text, add_special_tokens=False)
    assert RequestTokenizer(str(tmp_path)).prompt_ids(body, chat=True) == expected
