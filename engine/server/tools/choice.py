"""From `tools` + `tool_choice` to what the engine runs and how its output becomes tool calls.

- "none": the tools are not rendered; plain content.
- a named function: the output is held (grammar) to that function's
  parameters schema (`{"type": "object"}` when it declares none) and is the
  call's arguments.
- "required": the output is held to a JSON list of one or more
  `{"name": <one of the tools>, "parameters": <its schema>}`. The list ends
  when the model closes it, at MAX_REQUIRED_CALLS calls (1 with
  parallel_tool_calls false), where the grammar closes it, or at max_tokens
  (finish_reason "length"; the cut call is kept with its arguments so far,
  as a named function's cut call is, so streamed and whole answers agree).
  Without the cap a model that never closes the list (the embedded one,
  random ones) emitted calls until max_tokens.
- "auto": unconstrained; the model's family parser (`parsers.py`) reads
  calls back; a model without one gets a 400.
As in vLLM, the tools are rendered into the prompt through the chat
template for every choice but "none".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedinfer.engine.server.tools.parsers import ToolParser, parser_for_template

ANY_OBJECT = {"type": "object"}
MAX_REQUIRED_CALLS = 8  # calls in one "required" answer (OpenAI states no limit; models rarely make more)


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # "named" | "required" | "auto"
    function: str | None = None  # the named function
    parser: ToolParser | None = None  # "auto": the model family's parser


def _parameters(tool: Any) -> dict:
    return tool.function.parameters or ANY_OBJECT


def tool_plan(req: Any, chat_template: str | None) -> tuple[ToolPlan | None, dict | None]:
    """(the plan, the JSON schema to constrain the output to); (None, None) for "none". ValueError names the field."""
    choice = req.effective_tool_choice()
    if choice == "none":
        return None, None
    if choice == "auto":
        parser = parser_for_template(chat_template)
        if parser is None:
            raise ValueError(
                "tool_choice: 'auto' needs a tool-call parser, and this model's chat template renders "
                "tools in no supported format (hermes <tool_call>, llama3 JSON, mistral [TOOL_CALLS]); "
                "use 'required' or name a function"
            )
        return ToolPlan("auto", parser=parser), None
    if choice == "required":
        items = [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "parameters"],
                "properties": {"name": {"const": t.function.name}, "parameters": _parameters(t)},
            }
            for t in req.tools
        ]
        schema: dict = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else {"anyOf": items}}
        schema["maxItems"] = 1 if req.parallel_tool_calls is False else MAX_REQUIRED_CALLS
        return ToolPlan("required"), schema
    tool = next(t for t in req.tools if t.function.name == choice.function.name)
    return ToolPlan("named", function=tool.function.name), _parameters(tool)
