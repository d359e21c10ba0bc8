"""Every kernel variant the launchers use compiles for Hopper (sm_90) and fits its shared memory, no GPU needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_kernels_compile_for_sm90_within_shared_memory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # -P: the cwd is not put on sys.path (from the repo root, kernels/ would hide PyPI's `kernels`).
    result = subprocess.run(
        [sys.executable, "-P", "-m", "pagedinfer.kernels.compile_check", "--arch", "90"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(reports) >= 15, result.stdout + result.stderr[-3000:]
    failures = [r for r in reports if not r["ok"]]
    assert not failures, failures
    assert result.returncode == 0
