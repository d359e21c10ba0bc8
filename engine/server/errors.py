"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server reports goes through `ApiError` or one of the
exception handlers installed by `install_error_handlers`, so a client always
gets this shape, a status code that says whose fault it was, and a message
that names the offending parameter.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("pagedinfer.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "server_overloaded",
}


class ApiError(Exception):
    """An error answered to the client as-is (status, message, offending param, code)."""

    def __init__(self, status_code: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status_code: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status_code, "server_error"),
                      "param": param, "code": code}}


def error_response(status_code: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status_code, message, param, code), status_code=status_code, headers=headers)


def from_value_error(exc: ValueError) -> ApiError:
    """A 400 from our dataclasses' ValueError, whose message starts with "<param>: "."""
    message = str(exc)
    head, sep, _ = message.partition(":")
    param = head if sep and head.isidentifier() else None
    return ApiError(400, message, param=param, code="invalid_parameter")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None, "invalid_request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None, "invalid_json"
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown field"
    if first.get("type") == "missing" and not loc:
        return "request body is required", None, "invalid_request"
    if first.get("type") == "missing":
        msg = "field required"
    message = f"{param}: {msg}" if param else msg
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return message, param, "invalid_parameter"


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
        return error_response(exc.status_code, str(exc.detail), None, None, getattr(exc, "headers", None))

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(400, f"malformed JSON body: {exc}", None, "invalid_json")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error: %s", type(exc).__name__)
        return error_response(500, "internal server error", None, "internal_error")
