"""`POST /tokenize` and `POST /detokenize`, as vLLM's OpenAI server serves them.

/tokenize takes either `prompt` (text, tokenized with the special tokens
the completions endpoint adds unless `add_special_tokens` is false) or
`messages` (rendered through the chat template exactly as /v1/chat/completions
renders them, with `tools` if given, `add_generation_prompt` true by
default, no special tokens added on top). It answers `{"count", "max_model_len", "tokens",
"token_strs"}`, `token_strs` only with `return_token_strs`. /detokenize takes
`tokens` and answers `{"prompt"}`. `model` is optional (vLLM's); when given
it must be the served name. Both run on the server's tokenizer thread.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from pagedinfer.contracts.http.errors import ApiError
from pagedinfer.engine.server.extra_fields import ToolDefinition
from pagedinfer.engine.server.protocol import ChatCompletionRequest, ChatMessage, ErrorResponse
from pagedinfer.engine.server.serving import Serving

MAX_DETOKENIZE_TOKENS = 1 << 20


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None  # rendered with messages
    add_special_tokens: StrictBool | None = None  # default: True for prompt, False for messages (vLLM's)
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    tokens: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=MAX_DETOKENIZE_TOKENS)]


class DetokenizeResponse(BaseModel):
    prompt: str


def install_tokenize_routes(app: FastAPI, serving: Serving, dependencies: list[Any]) -> None:
    errors = {code: {"model": ErrorResponse} for code in (400, 404, 503)}

    @app.post("/tokenize", response_model=TokenizeResponse, responses=errors, dependencies=dependencies)
    async def tokenize(body: TokenizeRequest) -> dict:
        info = serving.admit_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(
                400, "prompt: give exactly one of prompt and messages", param="prompt", code="invalid_parameter"
            )

        def work() -> tuple[list[int], list[str] | None]:
            if body.messages is not None:
                chat = ChatCompletionRequest.model_construct(
                    messages=body.messages, model=info.served_model_name, tools=body.tools, tool_choice=None
                )
                text = serving.render_chat(info, chat, body.add_generation_prompt)
                ids = serving.tokenize_text(info, text, "messages", bool(body.add_special_tokens))
            else:
                special = True if body.add_special_tokens is None else body.add_special_tokens
                ids = serving.tokenize_text(info, body.prompt, "prompt", special)
            strs = info.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
            return ids, strs

        ids, strs = await serving.off_loop(work)
        return {"count": len(ids), "max_model_len": info.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=errors, dependencies=dependencies)
    async def detokenize(body: DetokenizeRequest) -> dict:
        info = serving.admit_model(body.model)
        limit = info.num_token_ids
        bad = next((t for t in body.tokens if t >= limit), None)
        if bad is not None:
            raise ApiError(
                400,
                f"tokens: token id {bad} is outside the model's vocabulary (ids 0-{limit - 1})",
                param="tokens",
                code="invalid_parameter",
            )
        return {"prompt": await serving.off_loop(lambda: info.tokenizer.decode(body.tokens))}
