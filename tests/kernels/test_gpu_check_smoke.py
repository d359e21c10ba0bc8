"""bench/gpu_check.py runs end to end in --smoke mode (tiny shapes, CPU, Triton interpreter) and reports JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_smoke_mode_passes_and_writes_json(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("PAGEDINFER_ATTENTION", None)
    # the engine section has its own smoke test (tests/bench/test_gpu_engine_check_smoke.py)
    result = subprocess.run(
        [
            sys.executable,
            "bench/gpu_check.py",
            "--smoke",
            "--sections",
            "correctness,layer kernels,decoder,bandwidth,prefill,e2e",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = report["sections"]
    assert sections["correctness"] and all(case["ok"] for case in sections["correctness"])
    cases = {case["case"] for case in sections["correctness"]}
    assert any(c.startswith("rotary+write_kv") for c in cases)  # our decoder's layer kernels
    assert {r["case"] for r in sections["bandwidth"]} >= {"copy", "decode", "decode_no_split"}
    engine, baseline = sections["e2e"]
    assert engine["output_tokens"] == engine["requested_tokens"]
    assert baseline["identical_outputs"] == baseline["num_requests"]  # float32: greedy equals generate
    assert "failed_sections" not in report
