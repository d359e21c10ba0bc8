"""config.json of an hf:// model, fetched over HTTP with a timeout and cached.

URL: `{endpoint}/{repo_id}/resolve/{revision}/config.json` (the Hugging Face
Hub layout; mirrors such as hf-mirror or an internal proxy serve the same).
A token, when configured, goes in `Authorization: Bearer` and never in logs.
Successes are cached for `ttl_seconds`, failures for `failure_ttl_seconds`
so a bad repo id does not hammer the Hub on every retry.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp


class ModelConfigError(Exception):
    """The config.json could not be fetched or parsed (message says why)."""


@dataclass
class HubConfigFetcher:
    endpoint: str = "https://huggingface.co"
    token: str | None = field(default=None, repr=False)
    timeout_seconds: float = 10.0
    ttl_seconds: float = 3600.0
    failure_ttl_seconds: float = 30.0
    _cache: dict[tuple[str, str], tuple[float, dict[str, Any] | ModelConfigError]] = field(default_factory=dict)
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    fetches: int = 0  # HTTP requests made (the cache's effect is visible in tests)

    def url(self, repo_id: str, revision: str) -> str:
        return f"{self.endpoint.rstrip('/')}/{repo_id}/resolve/{quote(revision, safe='')}/config.json"

    async def get(self, repo_id: str, revision: str = "main") -> dict[str, Any]:
        key = (repo_id, revision)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > time.monotonic():
                if isinstance(cached[1], ModelConfigError):
                    raise cached[1]
                return cached[1]
            try:
                config = await self._fetch(repo_id, revision)
            except ModelConfigError as exc:
                self._cache[key] = (time.monotonic() + self.failure_ttl_seconds, exc)
                raise
            self._cache[key] = (time.monotonic() + self.ttl_seconds, config)
            return config

    async def _fetch(self, repo_id: str, revision: str) -> dict[str, Any]:
        url = self.url(repo_id, revision)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.fetches += 1
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_seconds)) as session:
                async with session.get(url, headers=headers) as response:
                    if response.status != 200:
                        raise ModelConfigError(f"GET {url} answered {response.status}")
                    text = await response.text()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ModelConfigError(f"GET {url} failed: {type(exc).__name__} {exc}".rstrip()) from None
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"{url} is not valid JSON: {exc}") from None
        if not isinstance(config, dict):
            raise ModelConfigError(f"{url} is not a JSON object")
        return config
