"""From the request fields beyond sampling (`extra_fields.py`) to engine options.

Each function checks what needs the model (token ids against its
vocabulary, which features this server can serve) and raises an `ApiError`
400 naming the field; `serving.py` calls them before the engine sees the
request, so a refused request never holds a block.
"""

from __future__ import annotations

from typing import Any

from pagedinfer.contracts.http.errors import ApiError, from_value_error
from pagedinfer.engine.server.tools.choice import tool_plan


def logit_bias(info: Any, req: Any) -> dict[int, float] | None:
    """The request's logit_bias by token id; 400 naming logit_bias for an id outside the vocabulary."""
    bias = req.logit_bias_by_id()
    if not bias:
        return None
    limit = info.num_token_ids
    outside = sorted(t for t in bias if t >= limit)
    if outside:
        raise ApiError(
            400,
            f"logit_bias: token ids {outside[:8]} are outside the model's vocabulary (ids 0-{limit - 1})",
            param="logit_bias",
            code="invalid_parameter",
        )
    return bias


def completion_options(info: Any, req: Any, shape: Any) -> dict[str, Any]:
    """The SamplingParams fields a completion request's extras ask for (`shape`: its CompletionShape)."""
    options = _common_options(info, req)
    if shape.best_of is not None:
        if shape.best_of > info.max_num_seqs:
            raise ApiError(
                400,
                f"best_of: {shape.best_of} completions exceed this server's max_num_seqs ({info.max_num_seqs})",
                param="best_of",
                code="invalid_parameter",
            )
        options["n"] = shape.best_of
    options["prompt_logprobs"] = shape.engine_prompt_logprobs(req.logprobs)
    return options


def chat_options(info: Any, req: Any) -> tuple[dict[str, Any], Any]:
    """(the SamplingParams fields a chat request's extras ask for, its ToolPlan or None)."""
    from pagedinfer.engine.structured.params import StructuredOutputsParams

    options = _common_options(info, req)
    try:
        plan, schema = tool_plan(req, getattr(info.tokenizer, "chat_template", None))
    except ValueError as exc:
        raise from_value_error(exc) from None
    if schema is not None:
        if options["structured_outputs"] is not None:
            raise ApiError(
                400,
                f"tool_choice: {req.effective_tool_choice()!r} constrains the output itself; "
                f"drop response_format and guided_* fields",
                param="tool_choice",
                code="invalid_parameter",
            )
        options["structured_outputs"] = StructuredOutputsParams(json=schema, field="tools")
    return options, plan


def _common_options(info: Any, req: Any) -> dict[str, Any]:
    return {"logit_bias": logit_bias(info, req), "structured_outputs": structured_outputs(req)}


def structured_outputs(req: Any) -> Any:
    """The request's output constraint (response_format or one guided_* field), None when it has none."""
    from pagedinfer.engine.structured.params import StructuredOutputsParams

    fmt = req.response_format
    try:
        if fmt is not None and fmt.type == "json_schema":
            return StructuredOutputsParams(json=fmt.json_schema.json_schema, field="response_format")
        if fmt is not None and fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True, field="response_format")
        if req.structured_outputs is not None:
            return StructuredOutputsParams(**req.structured_outputs.options(), field="structured_outputs")
        for name, option in (
            ("guided_json", "json"),
            ("guided_regex", "regex"),
            ("guided_choice", "choice"),
            ("guided_grammar", "grammar"),
        ):
            value = getattr(req, name)
            if value is not None:
                return StructuredOutputsParams(**{option: value}, field=name)
    except ValueError as exc:
        raise from_value_error(exc) from None
    return None


def compile_structured(info: Any, spec: Any) -> None:
    """Compile the constraint into the engine's grammar cache (tokenizer thread); 400 naming its field."""
    if spec is None:
        return
    try:
        info.structured.compile(spec)
    except ValueError as exc:
        raise from_value_error(exc) from None
