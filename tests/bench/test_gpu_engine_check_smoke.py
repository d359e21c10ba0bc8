"""bench/gpu_check.py's engine section (bench/gpu_engine_check.py) runs in --smoke mode on the CPU and reports JSON.

Not a timing test: it checks the section runs every part with the decode graphs off and on, that the graph
steps ran in buckets, that the float32 outputs with the graphs equal generate, and that the no-host-sync check
says it cannot run on a CPU. The serve run is skipped here (a server start costs more than the rest; it was
run by hand in smoke mode, see docs/kernels.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_engine_section_runs_in_smoke_mode(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("PAGEDINFER_ATTENTION", None)
    result = subprocess.run(
        [sys.executable, "-P", "bench/gpu_check.py", "--smoke", "--sections", "engine", "--skip-serve"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "failed_sections" not in report
    records = report["sections"]["engine"]
    steps = [r for r in records if r["case"] == "decode_step"]
    assert {(r["graphs"], r["batch"]) for r in steps} == {(False, 1), (False, 4), (True, 1), (True, 4)}
    assert all(r["graph_steps"] == 3 for r in steps if r["graphs"])  # every timed step ran in a bucket
    start = next(r for r in records if r["case"] == "start" and r["graphs"])
    assert start["buckets"] == [1, 2, 4] and start["captured"] is False and start["planned_bytes"] > 0
    assert next(r for r in records if r["case"] == "no_host_sync") == {
        "case": "no_host_sync",
        "checked": False,
        "reason": "needs CUDA",
    }
    exact = [r for r in records if r["case"] == "exact_fp32_graphs"]
    assert exact and all(r["identical"] == r["requests"] for r in exact)
    assert next(r for r in records if r["case"] == "exact_fp32_bucket_runs")["leaked_blocks"] == 0
