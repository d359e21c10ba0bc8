"""The router's tokenizer: its `--tokenizer`, else the engines' own, fetched from them.

Prefix routing matches a prompt's block hashes against the hashes each engine
publishes, and those are over the engine's token ids, so the router must
tokenize exactly as the engines do. With `--tokenizer DIR` (the operator
mounts a `pvc://` or `file://` model) that directory is used, always. Without
it (an `hf://` model lives in the engine pods' cache) the router starts with
the embedded model's tokenizer, and as soon as an engine's `GET /kv_events`
names its tokenizer's fingerprint it fetches `GET /kv_events/tokenizer` from
that engine (with the router's API key, which the engines share), checks the
fingerprint and tokenizes with it from then on. An engine with another
fingerprint (a rollout to another model) makes it fetch again, so the router
follows the newest engine it discovered.

Invariants: a fetch that fails or does not check out leaves the current
tokenizer in place (routing still works: by hash and load until a match) and
is logged, never raised into the feed; one fetch at a time; every read is
bounded by FETCH_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from pagedinfer.contracts.kv_events.tokenizer_files import TOKENIZER_PATH, fingerprint
from pagedinfer.router.request_tokens import RequestTokenizer

logger = logging.getLogger("pagedinfer.router")

FETCH_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=10.0, pool=10.0)  # a 9 MB tokenizer.json reads in time


class RouterTokenizer:
    def __init__(self, tokenizer_dir: str | None, default_dir: str, api_key: str | None) -> None:
        self.pinned = tokenizer_dir is not None  # --tokenizer: never replaced
        self.current = RequestTokenizer(tokenizer_dir or default_dir)
        self.source = f"--tokenizer {tokenizer_dir}" if self.pinned else "the embedded model's"
        self.sha256: str | None = None  # of the engine tokenizer in use
        self._api_key = api_key
        self._lock = asyncio.Lock()

    async def offer(self, client: httpx.AsyncClient, url: str, sha256: str | None) -> None:
        """An engine at `url` tokenizes with the tokenizer of fingerprint `sha256` (from its GET /kv_events)."""
        if self.pinned or sha256 is None or sha256 == self.sha256:
            return
        async with self._lock:
            if sha256 == self.sha256:
                return
            try:
                tokenizer = await self._fetch(client, url, sha256)
            except (httpx.HTTPError, ValueError) as exc:
                logger.warning(
                    "the tokenizer of engine %s could not be taken (%s); still tokenizing with %s",
                    url,
                    exc,
                    self.source,
                )
                return
            self.current, self.sha256, self.source = tokenizer, sha256, f"engine {url}"
            logger.info("tokenizing with the tokenizer of engine %s (sha256 %s)", url, sha256[:12])

    async def _fetch(self, client: httpx.AsyncClient, url: str, sha256: str) -> RequestTokenizer:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        response = await client.get(url + TOKENIZER_PATH, headers=headers, timeout=FETCH_TIMEOUT)
        response.raise_for_status()
        body = response.json()
        files = body.get("files") if isinstance(body, dict) else None
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise ValueError(f"{url}{TOKENIZER_PATH}: no files in the answer")
        if fingerprint(files) != sha256:
            raise ValueError(f"{url}{TOKENIZER_PATH}: the files do not have the fingerprint GET /kv_events named")
        return await asyncio.get_running_loop().run_in_executor(None, RequestTokenizer.from_files, files, url)
