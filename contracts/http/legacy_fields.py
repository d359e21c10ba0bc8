"""OpenAI's retired request fields: refused as unknown, with the field that replaced each.

The openai client still accepts `functions` and `function_call` (deprecated
since the 2023-11 API, replaced by `tools` and `tool_choice`). This server
never honoured them; naming the replacement in the 400 turns a puzzling
"unknown field" into a one-line fix.
"""

from __future__ import annotations

REPLACED_BY = {
    "functions": "tools",  # [{"type": "function", "function": {...}}] instead of [{...}]
    "function_call": "tool_choice",  # {"type": "function", "function": {"name": ...}} instead of {"name": ...}
}


def unknown_field_message(param: str) -> str:
    """The 400's message (without the `param: ` prefix) for an unknown top-level field."""
    replacement = REPLACED_BY.get(param)
    if replacement is None:
        return "unknown field"
    return f"unknown field: OpenAI's legacy `{param}` is not supported; use `{replacement}` instead"
