"""Token ids of a request, computed exactly as the engine's server computes them, without torch.

transformers imports torch whenever torch is installed, so the router reads
the same files itself: `tokenizer.json` through the `tokenizers` library and
the chat template (tokenizer_config.json's `chat_template` or
`chat_template.jinja`) through a sandboxed jinja2 environment configured as
transformers configures it (trim_blocks, lstrip_blocks, `raise_exception`,
the special tokens as variables). tests/router checks the ids against the
engine's transformers tokenizer.

Completions: a text prompt is encoded with special tokens, token ids are
taken as given; chat: the messages (their tool calls too) and the tools go
through the template with the generation prompt, built as the engine's
server builds them (contracts/chat_template.py), and the text is encoded
without special tokens. A request the router cannot tokenize routes as
an unknown prefix; the engine then answers it with its own 4xx.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pagedinfer.contracts import chat_template

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class RequestTokenizer:
    def __init__(self, tokenizer_dir: str) -> None:
        """From a tokenizer directory (`--tokenizer`, or the embedded model's)."""
        root = Path(tokenizer_dir)
        try:
            tokenizer_json = (root / "tokenizer.json").read_text()
            config = (
                json.loads((root / "tokenizer_config.json").read_text())
                if (root / "tokenizer_config.json").is_file()
                else {}
            )
            template_file = (
                (root / "chat_template.jinja").read_text() if (root / "chat_template.jinja").is_file() else None
            )
            self._load(tokenizer_json, config, template_file)
        except Exception as exc:  # noqa: BLE001 - any loading failure names the directory
            raise ValueError(f"--tokenizer: cannot load {root / 'tokenizer.json'}: {exc}") from None

    @classmethod
    def from_files(cls, files: dict[str, str], source: str) -> RequestTokenizer:
        """From an engine's `GET /kv_events/tokenizer` files (contracts/kv_events/tokenizer_files.py); a ValueError
        naming `source` if they do not load."""
        self = cls.__new__(cls)
        try:
            self._load(
                files["tokenizer.json"],
                json.loads(files.get("tokenizer_config.json", "{}")),
                files.get("chat_template.jinja"),
            )
        except Exception as exc:  # noqa: BLE001 - any loading failure names where the files came from
            raise ValueError(f"the tokenizer from {source} does not load: {type(exc).__name__}: {exc}") from None
        return self

    def _load(self, tokenizer_json: str, config: dict[str, Any], template_file: str | None) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.special = {name: _token_text(config.get(name)) for name in _SPECIAL}
        template = config.get("chat_template")
        if template is None:
            template = template_file
        self.template = _compile(template) if isinstance(template, str) else None

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
        """As transformers renders it: `tools` and `documents` always given (None when absent)."""
        if self.template is None:
            raise ValueError("the tokenizer has no chat template")
        return self.template.render(
            messages=messages, tools=tools, documents=None, add_generation_prompt=True, **self.special
        )

    def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int] | None:
        """The token ids the engine will see for body's (first) prompt; None if there are none."""
        try:
            if chat:
                return self._chat_ids(body)
            return self._completion_ids(body.get("prompt"))
        except Exception:  # noqa: BLE001 - malformed input: the engine will name what is wrong
            return None

    def _completion_ids(self, prompt: Any) -> list[int] | None:
        if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
            prompt = prompt[0]  # a batch of prompts routes by its first
        if isinstance(prompt, str) and prompt:
            return self.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return None

    def _chat_ids(self, body: dict[str, Any]) -> list[int] | None:
        """The template's inputs as the engine's server builds them (contracts/chat_template.py)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        rendered = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = [part["text"] for part in content]
            text = chat_template.message_text(m["role"], content)
            if text is None:
                return None  # the engine refuses it
            rendered.append(
                chat_template.template_message(
                    m["role"], text, m.get("tool_calls"), m.get("tool_call_id"), m.get("name")
                )
            )
        tools = chat_template.template_tools(
            body.get("tools"), body.get("tool_choice", "auto" if body.get("tools") else "none")
        )
        return self.encode(self.render_chat(rendered, tools.get("tools")), add_special_tokens=False)


def _compile(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
