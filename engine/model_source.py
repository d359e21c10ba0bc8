"""Where a model's files come from: a local directory, a Hugging Face Hub id, or
(no model named) the small model embedded in the package
(`pagedinfer.contracts.embedded_model`), which `serve` and `generate` both default to.

A local directory is used as is. An id such as `org/name` is resolved with
huggingface_hub's `snapshot_download`, which honours HF_HUB_OFFLINE (the
operator sets it unless downloads are allowed): offline, only the local cache
(HF_HOME) is looked at. Only the files serving reads are fetched (configs,
tokenizer, safetensors weights, else .bin). Nothing is ever downloaded at import
or in tests.
"""

from __future__ import annotations

import re
from pathlib import Path

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What serving needs from a repository: configs, tokenizer files, chat templates, and the
# weights in one format (safetensors, else .bin). Repositories often carry more (Meta's
# `original/` checkpoints double a Llama-3 download; GGUF, ONNX, .pth exports), never read here.
_METADATA = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja", "tokenizer*"]
_NOT_SERVED = ["original/*", "*.pth", "*.pt", "*.gguf", "*.onnx", "*.msgpack", "*.h5"]


def resolve_model_dir(model: str, revision: str | None = None, name: str = "model") -> str:
    """A local directory holding the model, or ValueError naming what is wrong."""
    path = Path(model)
    if path.is_dir():
        return str(path)
    if model.startswith(("/", ".", "~")) or not _REPO_ID.match(model):
        raise ValueError(
            f"{name}: {model!r} is not a local directory (expected config.json, safetensors weights"
            " and a tokenizer) nor a Hugging Face id like 'org/name'"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        raise ValueError(f"{name}: {model!r} looks like a Hub id but huggingface_hub is not installed") from None
    try:
        folder = snapshot_download(
            repo_id=model, revision=revision, allow_patterns=[*_METADATA, "*.safetensors"], ignore_patterns=_NOT_SERVED
        )
        if not any(Path(folder).glob("*.safetensors")):  # an older repo with PyTorch pickles only
            folder = snapshot_download(
                repo_id=model, revision=revision, allow_patterns=[*_METADATA, "*.bin"], ignore_patterns=_NOT_SERVED
            )
        return folder
    except Exception as exc:  # offline cache miss, unknown repo, network error
        raise ValueError(
            f"{name}: could not resolve Hub model {model!r} (revision {revision or 'main'}):"
            f" {exc}. Mount the model directory instead, or allow downloads"
        ) from None
