"""Bearer API-key check for /v1/*.

The key comes from `--api-key` or the environment variable
PAGEDINFER_API_KEY. Comparison is constant-time (`hmac.compare_digest` on
bytes) so response timing does not leak how much of a guess was right. The
key is never logged or echoed. It guards /v1/* and the API's description
(/openapi.json, /docs, /redoc), which would tell an unauthenticated client
what the server serves; /health, /metrics and /version stay open so probes
and scrapers need no secret.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from typing import Any

from pagedinfer.contracts.http.errors import error_response

API_KEY_ENV = "PAGEDINFER_API_KEY"


def resolve_api_key(flag_value: str | None) -> str | None:
    """The flag wins over the environment; an empty string means no key."""
    key = flag_value if flag_value is not None else os.environ.get(API_KEY_ENV)
    return key or None


class ApiKeyMiddleware:
    """ASGI middleware: 401 on paths under `protected_prefixes` unless the request carries the key.

    It runs before the body is read, so an unauthenticated client can make the
    server neither buffer nor parse anything.
    """

    def __init__(self, app: Callable, api_key: str | None, protected_prefixes: tuple[str, ...] = ("/v1",)) -> None:
        self.app = app
        self._expected = api_key.encode("utf-8") if api_key else None
        self._prefixes = protected_prefixes

    def authorized(self, header_value: bytes | None) -> bool:
        if self._expected is None:
            return True
        scheme, _, token = (header_value or b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(token.strip(), self._expected)

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or self._expected is None or not scope.get("path", "").startswith(self._prefixes):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization")
        if not self.authorized(header):
            message = "incorrect API key" if header else "missing API key: send 'Authorization: Bearer <key>'"
            response = error_response(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
