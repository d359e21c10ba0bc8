"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server reports goes through `ApiError` or one of the
exception handlers installed by `install_error_handlers`, so a client always
gets this shape, a status code that says whose fault it was, and a message
that names the offending parameter.
"""

from __future__ import annotations

import json
import logging
import sys

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedinfer.contracts.http.legacy_fields import unknown_field_message

logger = logging.getLogger("pagedinfer.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",  # e.g. POST /sleep with requests in flight
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "service_unavailable_error",
}
_CODE_TYPES = {"server_overloaded": "server_overloaded"}  # a 503 for load, not for the server's state


class ApiError(Exception):
    """An error answered to the client as-is (status, message, offending param, code)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status_code: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = _CODE_TYPES.get(code, _TYPES.get(status_code, "server_error"))
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII characters escaped.

    An error message may quote what the client sent (a model name, a field
    name), and a lone surrogate in it (JSON's "\\ud800" decodes to one) has
    no UTF-8 encoding: escaped, it goes back as it came.
    """

    def render(self, content: object) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(
    status_code: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return AsciiJSONResponse(error_body(status_code, message, param, code), status_code=status_code, headers=headers)


def from_value_error(exc: ValueError) -> ApiError:
    """A 400 from our dataclasses' ValueError, whose message starts with "<param>: "."""
    message = str(exc)
    head, sep, _ = message.partition(":")
    param = head if sep and head.isidentifier() else None
    return ApiError(400, message, param=param, code="invalid_parameter")


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_tag(part: object) -> bool:
    """pydantic names union members in error locations ('str', 'list[int]', 'function-after[...]')."""
    return isinstance(part, str) and ("[" in part or "-" in part or part in _TYPE_TAGS)


def _split_loc(loc: tuple) -> tuple[str | None, str | None]:
    """(parameter path before any union tag, full parameter path without tags)."""
    parts = [p for p in loc if p != "body"]
    head: list[str] = []
    for p in parts:
        if _is_tag(p):
            break
        head.append(str(p))
    full = [str(p) for p in parts if not _is_tag(p)]
    return ".".join(head) or None, ".".join(full) or None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None, "invalid_request"
    first = errors[0]
    kind = first.get("type")
    if kind == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None, "invalid_json"
    union_param, param = _split_loc(tuple(first.get("loc", ())))
    if kind == "missing" and param is None:
        return "request body is required", None, "invalid_request"
    if kind in ("model_type", "model_attributes_type", "dict_type") and param is None:
        return "request body: must be a JSON object", None, "invalid_request"
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param is None:
        head, sep, _ = msg.partition(":")
        if sep and head.isidentifier():
            return msg, head, "invalid_parameter"
        return msg, None, "invalid_parameter"
    related = [e for e in errors if _split_loc(tuple(e.get("loc", ())))[0] == union_param]
    if kind == "extra_forbidden":
        msg = unknown_field_message(param)
    elif kind == "missing":
        msg = "field required"
    elif any(_is_tag(p) for p in first.get("loc", ())) and len(related) > 1:
        param = union_param
        # Constraint violations (a negative token id) say more than type mismatches of other union members.
        ranked = sorted(related, key=lambda e: str(e.get("type", "")).endswith("_type"))
        alternatives = list(
            dict.fromkeys(f"{e.get('msg', '')} at {_split_loc(tuple(e.get('loc', ())))[1]}" for e in ranked)
        )
        msg = "matches none of the accepted forms: " + "; ".join(alternatives[:3])
    else:
        related = [first]
    message = f"{param}: {msg}"
    others = len(errors) - len(related)
    if others > 0:
        message += f" (and {others} more problem{'s' if others > 1 else ''})"
    return message, param, "invalid_parameter"


_UNPARSABLE_BODY = "There was an error parsing the body"


def unparsable_body_message(cause: BaseException | None) -> tuple[str, str]:
    """(message, code) for a body FastAPI could not parse, from the exception it wrapped.

    FastAPI answers every non-JSONDecodeError failure of `json.loads` with one
    HTTPException; its `__cause__` says what actually went wrong.
    """
    if isinstance(cause, UnicodeDecodeError):
        return f"malformed JSON body: not valid UTF-8 ({cause.reason} at byte {cause.start})", "invalid_json"
    if isinstance(cause, RecursionError):
        return "request body: JSON nested too deeply to parse", "invalid_request"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return (f"request body: a JSON integer has more than {sys.get_int_max_str_digits()} digits", "invalid_request")
    return f"request body: cannot be parsed as JSON ({type(cause).__name__})", "invalid_request"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(exc)
        return error_response(400, message, param, code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == _UNPARSABLE_BODY:
            message, code = unparsable_body_message(exc.__cause__)
            return error_response(400, message, None, code)
        return error_response(exc.status_code, str(exc.detail), None, None, getattr(exc, "headers", None))

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(400, f"malformed JSON body: {exc}", None, "invalid_json")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error: %s", type(exc).__name__)
        return error_response(500, "internal server error", None, "internal_error")
