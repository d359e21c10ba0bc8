"""Reading a model's own tool-call format back from its text ("auto" tool choice), one parser per family.

Supported families, recognised from the chat template the model ships:
- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one
  block per call (Qwen2/2.5/3, Hermes 2/3, and others trained on that format);
- llama3_json: a JSON object `{"name": ..., "parameters": {...}}` (several
  separated by ";"), optionally after `<|python_tag|>` (Llama 3.1/3.2/3.3);
- mistral: `[TOOL_CALLS]` followed by a JSON list of {"name", "arguments"}.
A template that renders tools in none of these ways has no parser: "auto"
is then refused with a 400 saying so (named and "required" still work).

A parser never raises on what a model writes: text that does not parse as
calls stays content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object


@dataclass(frozen=True)
class ToolParser:
    """A family's format: where calls start (`marker`), and how to read them."""

    name: str
    marker: str  # text that starts the calls; content before it is the message's content

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content, calls); calls empty and content the whole text when the text holds no valid call."""
        at = text.find(self.marker)
        if at < 0:
            return text, []
        calls = _READERS[self.name](text[at + len(self.marker) :])
        if not calls:
            return text, []
        return text[:at].strip(), calls


def _call(obj: object, arguments_key: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _read_hermes(text: str) -> list[ParsedCall]:
    calls = []
    for block in re.findall(r"(.*?)</tool_call>", "<tool_call>" + text, flags=re.S):
        body = block.replace("<tool_call>", "").strip()
        try:
            call = _call(json.loads(body), "arguments")
        except ValueError:
            return []
        if call is None:
            return []
        calls.append(call)
    return calls


def _read_llama3(text: str) -> list[ParsedCall]:
    calls = []
    decoder = json.JSONDecoder()
    rest = text.strip()
    while rest:
        try:
            obj, end = decoder.raw_decode(rest)
        except ValueError:
            return []
        call = _call(obj, "parameters")
        if call is None:
            return []
        calls.append(call)
        rest = rest[end:].strip().removeprefix(";").strip()
    return calls


def _read_mistral(text: str) -> list[ParsedCall]:
    try:
        items = json.loads(text.strip())
    except ValueError:
        return []
    items = items if isinstance(items, list) else [items]
    calls = [_call(item, "arguments") for item in items]
    return [] if any(c is None for c in calls) else calls


def _first_json_object(text: str) -> int | None:
    stripped = text.lstrip()
    return len(text) - len(stripped) if stripped.startswith("{") else None


_READERS = {"hermes": _read_hermes, "llama3_json": _read_llama3, "mistral": _read_mistral}

HERMES = ToolParser("hermes", "<tool_call>")
MISTRAL = ToolParser("mistral", "[TOOL_CALLS]")


def parser_for_template(template: str | None) -> ToolParser | None:
    """The parser of the family whose tool format this chat template renders, None if it renders none."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or '"parameters"' in template:
        return LLAMA3_JSON
    return None


@dataclass(frozen=True)
class _Llama3Parser(ToolParser):
    """Llama 3's calls may come with or without <|python_tag|>; without, the text must be the JSON itself."""

    name: str = "llama3_json"
    marker: str = "<|python_tag|>"

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        if self.marker in text:
            return ToolParser.parse(self, text)
        start = _first_json_object(text)
        if start is None:
            return text, []
        calls = _read_llama3(text[start:])
        return ("", calls) if calls else (text, [])


LLAMA3_JSON = _Llama3Parser()
