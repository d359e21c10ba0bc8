"""OpenAI-compatible request and response models (pydantic).

Requests forbid unknown fields, so a typo such as `max_token` is a 400 that
names the field instead of being silently ignored. Range checks here mirror
`SamplingParams`; the engine validates again when the request is added.
Extra vLLM-style sampling fields (`top_k`, `min_p`, `repetition_penalty`,
`ignore_eos`, `min_tokens`, `use_beam_search`, `length_penalty`) sit beside
OpenAI's own; the fields beyond sampling (`logit_bias`, `response_format`,
`echo`, `tools`, ...) come from `extra_fields.py`'s mixins.

Every optional field accepts JSON null and treats it as its default, as
OpenAI declares them nullable and vLLM accepts null (`"n": null` is n=1).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pagedinfer.engine.server.extra_fields import AssistantToolCall, ChatExtras, CompletionExtras

MAX_N = 16
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
MAX_PROMPTS = 256  # prompts in one completions request (each is its own engine request)

Number = Annotated[float, AllowInfNan(False)]
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


def _default_if_null(model: type[BaseModel], value: object, info: ValidationInfo) -> object:
    return model.model_fields[info.field_name].default if value is None else value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool | None = False

    @field_validator("include_usage")
    @classmethod
    def _null_include_usage(cls, value: object, info: ValidationInfo) -> object:
        return _default_if_null(cls, value, info)


class _SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    temperature: Number | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Number | None = Field(default=None, gt=0.0, le=1.0)
    n: StrictInt | None = Field(default=1, ge=1, le=MAX_N)
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: StrictInt | None = None
    presence_penalty: Number | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Number | None = Field(default=None, ge=-2.0, le=2.0)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    top_k: StrictInt | None = Field(default=None, ge=-1)  # -1 and 0: no cut (vLLM)
    min_p: Number | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Number | None = Field(default=None, gt=0.0, le=2.0)
    ignore_eos: StrictBool | None = False
    min_tokens: StrictInt | None = Field(default=0, ge=0)
    use_beam_search: StrictBool | None = False  # vLLM's: n is the beam width (server/beam_request.py)
    length_penalty: Number | None = None  # beam search only; default 1.0

    @field_validator("n", "stream", "ignore_eos", "min_tokens", "use_beam_search")
    @classmethod
    def _null_sampling_fields(cls, value: object, info: ValidationInfo) -> object:
        return _default_if_null(cls, value, info)

    @model_validator(mode="after")
    def _check_stop(self):
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if any(not s for s in stops):
            raise ValueError("stop: stop strings must be non-empty")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        return self


class CompletionRequest(CompletionExtras, _SamplingFields):
    prompt: (
        StrictStr
        | Annotated[list[StrictStr], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    max_tokens: StrictInt | None = Field(default=16, ge=0)  # 0 only with echo (extra_fields.py)
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("max_tokens")
    @classmethod
    def _null_max_tokens(cls, value: object, info: ValidationInfo) -> object:
        return _default_if_null(cls, value, info)

    @model_validator(mode="after")
    def _check_num_prompts(self):
        num_prompts = len(self.prompts())
        if num_prompts > MAX_PROMPTS:
            raise ValueError(f"prompt: at most {MAX_PROMPTS} prompts per request, got {num_prompts}")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (text or token ids)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]
        return list(self.prompt)


class TextContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Annotated[list[TextContentPart], Field(min_length=1)] | None = None  # may be null
    name: StrictStr | None = None
    tool_calls: Annotated[list[AssistantToolCall], Field(max_length=128)] | None = None  # assistant only
    tool_call_id: StrictStr | None = None  # role "tool": the call this answers

    @model_validator(mode="after")
    def _check_tool_fields(self):
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message carries tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a tool message must name the call it answers")
        return self


class ChatCompletionRequest(ChatExtras, _SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @field_validator("logprobs")
    @classmethod
    def _null_logprobs(cls, value: object, info: ValidationInfo) -> object:
        return _default_if_null(cls, value, info)

    @model_validator(mode="after")
    def _check_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        return self

    def requested_max_tokens(self) -> tuple[int | None, str]:
        """(the limit asked for, the field it came from): max_completion_tokens wins over max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None for an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pagedinfer"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
