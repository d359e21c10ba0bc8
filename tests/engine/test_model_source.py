"""Where a model comes from: a local directory, or a Hub id resolved from the local cache only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
from hub_cache import make_hub_cache

from pagedinfer.engine.model_source import resolve_model_dir

RESOLVE = "import sys; from pagedinfer.engine.model_source import resolve_model_dir as r; print(r(*sys.argv[1:]))"


def resolve_offline(hf_home: Path, *args: str) -> subprocess.CompletedProcess:
    """In a fresh process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when imported."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-P", "-c", RESOLVE, *args], env=env, capture_output=True, text=True, timeout=120, cwd="/"
    )


def test_a_local_directory_is_used_as_is(tiny_llama):
    assert resolve_model_dir(str(tiny_llama)) == str(tiny_llama)


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(tiny_llama, tmp_path):
    snapshot = make_hub_cache(tmp_path, "acme/tiny", tiny_llama)
    done = resolve_offline(tmp_path, "acme/tiny")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == snapshot


def test_an_uncached_hub_id_is_a_value_error_naming_the_model(tmp_path):
    done = resolve_offline(tmp_path, "acme/absent")
    assert done.returncode != 0
    assert "ValueError: model: could not resolve Hub model 'acme/absent'" in done.stderr


@pytest.mark.parametrize("name", ["/no/such/dir", "not a repo id", "a/b/c"])
def test_what_is_neither_a_directory_nor_a_hub_id_is_refused(name):
    with pytest.raises(ValueError, match="is not a local directory"):
        resolve_model_dir(name)


def test_only_the_files_serving_reads_are_fetched_safetensors_first_then_bin(tmp_path, monkeypatch):
    """What is asked of the Hub (no network here: the download itself is huggingface_hub's)."""
    calls = []
    folder = tmp_path / "snapshot"
    folder.mkdir()

    def snapshot_download(repo_id, revision, allow_patterns, ignore_patterns):
        calls.append((allow_patterns, ignore_patterns))
        if "*.bin" in allow_patterns:
            (folder / "pytorch_model.bin").write_bytes(b"")
        (folder / "config.json").write_text(json.dumps({}))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert resolve_model_dir("acme/old") == str(folder)
    (first_allow, ignore), (second_allow, _) = calls
    assert "*.safetensors" in first_allow and "*.bin" not in first_allow
    assert "*.bin" in second_allow and "*.safetensors" not in second_allow
    assert {"*.json", "tokenizer*"} <= set(first_allow) and "original/*" in ignore
