"""What a chat template is given for an OpenAI chat request: one definition for the engine's server and the router.

The engine renders with transformers' `apply_chat_template` (engine/server/serving.py), the router, which
has no transformers, with a sandboxed jinja2 configured as transformers configures it
(router/request_tokens.py); both give the template the same inputs, built here from the request's
fields: each message's content as one string (text parts joined by newlines, as vLLM), its tool calls
with their arguments as objects (transformers' convention), the name and the call a tool message
answers; the request's tools unless tool_choice is "none"; the generation prompt. The rendered text is
encoded without special tokens (the template writes them). Pure, standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def message_text(role: str, content: str | Sequence[str] | None) -> str | None:
    """The content as one string, text parts joined by newlines.

    Null content is "" for an assistant message (OpenAI allows it there) and None otherwise, which the
    server refuses naming the message.
    """
    if content is None:
        return "" if role == "assistant" else None
    if isinstance(content, str):
        return content
    return "\n".join(content)


def template_message(
    role: str,
    text: str,
    tool_calls: Sequence[Mapping[str, Any]] | None = None,
    tool_call_id: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """A history message as chat templates take it; tool_calls in OpenAI's shape (`id`, `function`)."""
    out: dict[str, Any] = {"role": role, "content": text}
    if tool_calls:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])},
            }
            for c in tool_calls
        ]
    if tool_call_id is not None:
        out["tool_call_id"] = tool_call_id
    if name is not None:
        out["name"] = name
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: the template gets it as sent


def template_tools(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> dict[str, Any]:
    """The template's `tools` argument: the request's tools (as JSON objects), none when there are none or
    tool_choice is "none"."""
    if not tools or tool_choice == "none":
        return {}
    return {"tools": list(tools)}
