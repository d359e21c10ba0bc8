"""The request fields that OpenAI's and vLLM's clients send beyond the sampling core.

`protocol.py`'s request models inherit these mixins, so every field a
current `openai` client, lm-evaluation-harness or an agent framework sends
is accepted (unknown fields are still a 400 naming them). What each field
does here:

- honoured: `logit_bias`, `response_format`, vLLM's `guided_json`,
  `guided_regex`, `guided_choice`, `guided_grammar` (structured outputs,
  `engine/structured/`), completions' `echo`, `best_of` and vLLM's
  `prompt_logprobs`, chat's `tools`, `tool_choice`, `parallel_tool_calls`.
- accepted and ignored (they describe the caller or OpenAI's own storage,
  tiers, prompt-cache routing and reasoning models, nothing a self-hosted
  engine has): `user`, `store`, `metadata`, `service_tier`; on chat also
  `safety_identifier`, `prompt_cache_key`, `reasoning_effort`, `verbosity`,
  and `modalities` when it asks for text only.
- `suffix` (fill-in-the-middle) is refused with a 400 naming it unless null
  or empty: no model this engine serves declares a fill-in-the-middle template.

Validation that needs no model (ranges, shapes, which fields combine) lives
here; what needs the model (token ids in the vocabulary, schemas the grammar
backend compiles) is checked in `serving.py` before the engine sees it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from pagedinfer.engine.sampling_params import LOGIT_BIAS_LIMIT

MAX_LOGIT_BIAS_ENTRIES = 1024  # vLLM takes any number; bounded so one request cannot make every step slow
MAX_BEST_OF = 16

Number = Annotated[float, AllowInfNan(False)]


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`: OpenAI's name, description, schema and strict."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: StrictStr = "response"
    description: StrictStr | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check_schema(self):
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.json_schema is None):
            raise ValueError("json_schema.schema: is required when type is 'json_schema'")
        return self


class VllmStructuredOutputs(BaseModel):
    """vLLM's newer `structured_outputs` extra: one of json, regex, choice, grammar, json_object.

    Its whitespace and fallback switches are accepted: output JSON here is
    always compact and there is one backend, so they change nothing.
    """

    model_config = ConfigDict(extra="forbid")
    json_schema: StrictStr | dict[str, Any] | None = Field(default=None, alias="json")
    regex: StrictStr | None = None
    choice: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None
    disable_fallback: StrictBool | None = None
    disable_any_whitespace: StrictBool | None = None
    disable_additional_properties: StrictBool | None = None

    def options(self) -> dict[str, Any]:
        """The StructuredOutputsParams fields asked for."""
        given = {"json": self.json_schema, "regex": self.regex, "choice": self.choice, "grammar": self.grammar}
        out = {k: v for k, v in given.items() if v is not None}
        if self.json_object:
            out["json_object"] = True
        return out


class _CommonExtras(BaseModel):
    """Fields of both /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid")

    logit_bias: dict[StrictStr, Number] | None = None
    response_format: ResponseFormat | None = None
    guided_json: StrictStr | dict[str, Any] | None = None
    guided_regex: StrictStr | None = None
    guided_choice: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    guided_grammar: StrictStr | None = None
    structured_outputs: VllmStructuredOutputs | None = None
    store: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    service_tier: StrictStr | None = None

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(f"at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(value)}")
        for key, bias in value.items():
            if not (key.isascii() and key.isdigit()):  # isdigit alone admits "²", which int() refuses
                raise ValueError(f"keys are token ids (non-negative integers), got {key!r}")
            if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise ValueError(f"the bias of token {key} must be in [-100, 100], got {bias!r}")
        return value

    @model_validator(mode="after")
    def _one_structure(self):
        asked = [
            name
            for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
            if getattr(self, name) is not None
        ]
        if self.response_format is not None and self.response_format.type != "text":
            asked.append("response_format")
        if len(asked) > 1:
            raise ValueError(f"{asked[1]}: only one structured-output constraint per request, got {asked}")
        return self

    def logit_bias_by_id(self) -> dict[int, float] | None:
        return {int(k): float(v) for k, v in self.logit_bias.items()} if self.logit_bias else None


class CompletionExtras(_CommonExtras):
    echo: StrictBool | None = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = Field(default=None, ge=1, le=MAX_BEST_OF)
    prompt_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)

    @field_validator("echo")
    @classmethod
    def _null_echo(cls, value: object) -> object:
        return False if value is None else value

    @model_validator(mode="after")
    def _check_completion_extras(self):
        if getattr(self, "max_tokens", None) == 0 and not self.echo:
            raise ValueError("max_tokens: 0 is allowed only with echo (to score the prompt alone)")
        if self.suffix:
            raise ValueError("suffix: this model has no fill-in-the-middle template; send the prompt alone")
        n = getattr(self, "n", 1) or 1
        if self.best_of is not None and self.best_of < n:
            raise ValueError(f"best_of: must be >= n ({n}), got {self.best_of}")
        if self.best_of is not None and self.best_of > n and getattr(self, "stream", False):
            raise ValueError("best_of: streaming is not supported when best_of > n")
        return self


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class AssistantToolCall(BaseModel):
    """A call in an assistant message of the history."""

    model_config = ConfigDict(extra="forbid")
    id: StrictStr
    type: Literal["function"] = "function"
    function: CalledFunction


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: StrictStr


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class ChatExtras(_CommonExtras):
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    # accepted and ignored: the caller's identity, OpenAI's prompt-cache routing (prefix caching here is
    # automatic), options of OpenAI's reasoning models; text is the only output modality
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    reasoning_effort: StrictStr | None = None
    verbosity: StrictStr | None = None
    modalities: list[Literal["text"]] | None = None

    @model_validator(mode="after")
    def _check_tools(self):
        names = [t.function.name for t in self.tools or ()]
        duplicate = next((name for name in names if names.count(name) > 1), None)
        if duplicate is not None:
            raise ValueError(f"tools: function {duplicate!r} is defined twice")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise ValueError(
                f"tool_choice: function {self.tool_choice.function.name!r} is not among the tools "
                f"({names or 'none given'})"
            )
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice: 'required' needs at least one tool in tools")
        return self

    def effective_tool_choice(self) -> str | NamedToolChoice:
        """OpenAI's default: "auto" when tools are given, "none" otherwise."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"
