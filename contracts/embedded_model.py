"""Where the small model embedded in the package lies: `contracts/default_model/` (package data).

`serve` and `generate` run it when no model is named; the router tokenizes with its tokenizer when it has
none of its own; the operator sizes a service that names no model from its config.json. Trained by
scripts/train_default_model.py.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def default_model_dir() -> Path:
    """The embedded model's directory: its config, tokenizer and weights."""
    return Path(str(resources.files("pagedinfer.contracts") / "default_model"))
