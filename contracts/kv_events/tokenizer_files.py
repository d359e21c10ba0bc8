"""The engine's tokenizer as files a torch-free consumer loads: how a router tokenizes exactly as the engine.

A KV event carries block hashes over token ids, so a router that wants to
match a prompt against them must produce the engine's token ids. It cannot
always read the model (an `hf://` model lives in the engine pod's cache), so
the engine serves what its own tokenizer is (`GET /kv_events/tokenizer`,
with `--kv-events`):

- `tokenizer.json`: the fast tokenizer's Rust backend, serialized as loaded
  (added tokens and the post-processor that adds BOS included), which is what
  the engine's `encode` runs;
- `tokenizer_config.json`: the special tokens and the chat template, the
  variables a chat template reads.

`router/request_tokens.py` loads exactly these two names. The fingerprint
(sha256 over names and contents) is in `GET /kv_events`, so a consumer
fetches the files once and again only if an engine's fingerprint changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

TOKENIZER_PATH = "/kv_events/tokenizer"  # the route (engine/kv_events/routes.py) a router fetches them from
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass(frozen=True)
class TokenizerFiles:
    files: dict[str, str]  # name -> text
    sha256: str  # over the sorted names and their contents

    def body(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "files": self.files}


def tokenizer_files(tokenizer: Any) -> TokenizerFiles:
    """The files of a loaded transformers tokenizer; ValueError if it has no fast (Rust) backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{type(tokenizer).__name__} has no fast tokenizer to serve (no tokenizer.json)")
    config: dict[str, Any] = {}
    for name in SPECIAL_TOKENS:
        value = getattr(tokenizer, name, None)
        if value is not None:
            config[name] = str(value)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        config["chat_template"] = template
    files = {"tokenizer.json": backend.to_str(), "tokenizer_config.json": json.dumps(config, ensure_ascii=False)}
    return TokenizerFiles(files, fingerprint(files))


def fingerprint(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        for part in (name, files[name]):
            data = part.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()
