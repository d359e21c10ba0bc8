"""The tree's lint and format (pyproject.toml's [tool.ruff]), run by the test command so CI runs them too.

`ruff check .` and `ruff format --check .` from the repository root; fix with `ruff check --fix .` and
`ruff format .` (the venv's ruff: `.venv/bin/ruff`).
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")


@pytest.mark.parametrize(
    "args", [["check", "--output-format", "concise", "."], ["format", "--check", "."]], ids=["check", "format"]
)
def test_ruff_passes_on_the_whole_tree(args):
    done = subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff {' '.join(args)}:\n{done.stdout}{done.stderr}"
