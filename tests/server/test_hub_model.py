"""`pagedinfer serve --model org/name` (what the operator runs for hf:// models) serves the cached snapshot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hub_cache import make_hub_cache

from pagedinfer.testing.server_process import free_port, wait_process_healthy

CLI = Path(sys.executable).with_name("pagedinfer")


def offline_env(hf_home: Path) -> dict:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PAGEDINFER_API_KEY", None)
    return env


@pytest.mark.slow
def test_serve_takes_a_hub_id_from_the_offline_cache(tiny_llama, tmp_path):
    make_hub_cache(tmp_path / "hf", "acme/tiny", tiny_llama)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen(
        [
            str(CLI),
            "serve",
            "--model",
            "acme/tiny",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--max-model-len",
            "256",
            "--num-gpu-blocks-override",
            "32",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=offline_env(tmp_path / "hf"),
    )
    try:
        wait_process_healthy(url, proc)
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["acme/tiny"]
        r = httpx.post(
            url + "/v1/completions", json={"model": "acme/tiny", "prompt": "hi", "max_tokens": 3}, timeout=60
        )
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_with_an_uncached_hub_id_exits_2_naming_the_flag(tmp_path):
    proc = subprocess.run(
        [str(CLI), "serve", "--model", "acme/absent"],
        capture_output=True,
        text=True,
        timeout=120,
        env=offline_env(tmp_path),
    )
    assert proc.returncode == 2, proc.stderr
    last_line = proc.stderr.strip().splitlines()[-1]
    assert "--model" in last_line and "acme/absent" in last_line and "Traceback" not in proc.stderr
