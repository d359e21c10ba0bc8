"""A Hugging Face Hub cache on disk, as `snapshot_download` leaves it, made from a local model directory."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def make_hub_cache(hf_home: Path, repo_id: str, model_dir: Path, revision: str = "main") -> Path:
    """Put model_dir's files in hf_home's hub cache as repo_id at `revision`; returns the snapshot folder."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(model_dir, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(COMMIT)
    return snapshot
