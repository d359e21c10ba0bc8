"""schemathesis, driven by the server's own /openapi.json, finds no 5xx (a bounded number of examples).

Its fuzzing phase only, positive and negative cases of every operation: the coverage phase's ~1,500
deterministic boundary cases took most of this test's time (83 s in CI) for little over what the bad
request tests check one by one, and the schema has no examples for the examples phase.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest


def test_openapi_schema_lists_every_endpoint(server):
    schema = httpx.get(server.url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/version"} <= set(
        schema["paths"]
    )


@pytest.mark.slow
def test_generated_requests_never_get_a_server_error(server, tmp_path):
    cli = Path(sys.executable).with_name("schemathesis")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    proc = subprocess.run(
        [
            str(cli),
            "run",
            server.url + "/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "5",
            "--seed",
            "1",
            "--request-timeout",
            "60",
            "--mode",
            "all",
            "--phases",
            "fuzzing",
            "--suppress-health-check",
            "all",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    operations = len([op for path in httpx.get(server.url + "/openapi.json").json()["paths"].values() for op in path])
    assert f"Operations:       {operations} selected / {operations} total" in proc.stdout, proc.stdout[-4000:]
    assert f"✅ {operations} passed" in proc.stdout, proc.stdout[-4000:]  # every operation was fuzzed
    assert httpx.get(server.url + "/health").status_code == 200
    metrics = server.wait_idle()
    assert metrics["pagedinfer_kv_cache_used_blocks"] == 0
