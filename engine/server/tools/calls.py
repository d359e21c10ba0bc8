"""A chat choice's text to OpenAI's assistant message with `tool_calls`, whole or as stream deltas.

Invariant: for a named function or "required", the calls of the whole
message are the calls a stream of the same output accumulates, cut by
max_tokens or not (a cut call keeps its arguments so far; finish_reason
"length" marks it), and the raw output is never content.
"""

from __future__ import annotations

import uuid

from pagedinfer.engine.server.tools import required
from pagedinfer.engine.server.tools.choice import ToolPlan
from pagedinfer.engine.server.tools.parsers import ParsedCall


def parse_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a finished choice's text under the plan."""
    if plan.mode == "named":
        return None, [ParsedCall(plan.function, text)]
    if plan.mode == "required":  # cut by max_tokens, the calls so far: what a stream of it has sent
        return None, [ParsedCall(c.name, c.arguments) for c in required.scan(text)]
    content, calls = plan.parser.parse(text)
    return (content or None) if calls else text, calls


def growing_calls(plan: ToolPlan, text: str) -> list[tuple[str, str]]:
    """(name, arguments so far) of the calls in a constrained (named or required) output, finished or not."""
    if plan.mode == "named":
        return [(plan.function, text)]
    return [(c.name, c.arguments) for c in required.scan(text)]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_tool_calls(calls: list[ParsedCall]) -> list[dict]:
    return [
        {"id": new_call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
    ]


def message(plan: ToolPlan, text: str) -> tuple[dict, bool]:
    """(the assistant message, whether it calls tools)."""
    content, calls = parse_calls(plan, text)
    if not calls:  # "required" cut before its first call's name: no content either (none streams)
        return {"role": "assistant", "content": None if plan.mode == "required" else text}, False
    return {"role": "assistant", "content": content, "tool_calls": openai_tool_calls(calls)}, True


def streamable_chars(plan: ToolPlan, text: str) -> int:
    """How much of a streamed choice's text may go out as content now: none of what is, or may grow into, calls."""
    if plan.mode != "auto":
        return 0
    marker = plan.parser.marker
    if plan.parser.name == "llama3_json" and text.lstrip().startswith("{"):
        return 0
    at = text.find(marker)
    if at >= 0:
        return at
    partial = next((i for i in range(len(marker) - 1, 0, -1) if text.endswith(marker[:i])), 0)
    return len(text) - partial


def stream_finish(plan: ToolPlan, text: str, sent_chars: int) -> tuple[str, list[dict]]:
    """At a streamed choice's end: (content still to send, tool_calls deltas in OpenAI's chunk shape)."""
    _, calls = parse_calls(plan, text)
    if not calls:
        return text[sent_chars:], []
    at = max(0, text.find(plan.parser.marker))  # "auto" only: constrained calls stream as they grow
    deltas = [{"index": i, **call} for i, call in enumerate(openai_tool_calls(calls))]
    return text[sent_chars:at].rstrip() if at > sent_chars else "", deltas
