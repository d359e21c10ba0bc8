"""Reading a model directory's config.json (no torch, no downloads)."""

from __future__ import annotations

import json
from pathlib import Path


def load_hf_config(path: str | Path, name: str = "model") -> dict:
    """The parsed config.json of a model directory (or of a config.json path itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"{name}: no config.json at {p} (expected a Hugging Face model directory)")
    try:
        config = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: {p} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{name}: {p} must hold a JSON object")
    return config
