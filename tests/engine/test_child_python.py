"""Every Python child the product starts runs the same interpreter and never imports from its working
directory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pagedinfer.engine.child_python import child_python_argv


def test_a_module_or_code_after_minus_p_and_the_same_interpreter():
    assert child_python_argv(module="pagedinfer.engine.cli", args=("serve", 2)) == [
        sys.executable,
        "-P",
        "-m",
        "pagedinfer.engine.cli",
        "serve",
        "2",
    ]
    assert child_python_argv(code="print(1)") == [sys.executable, "-P", "-c", "print(1)"]


@pytest.mark.parametrize("kwargs", [{}, {"module": "m", "code": "c"}])
def test_exactly_one_of_module_and_code(kwargs):
    with pytest.raises(ValueError, match="exactly one of module= and code="):
        child_python_argv(**kwargs)


def test_a_child_in_a_directory_of_decoy_packages_imports_the_installed_ones(tmp_path):
    for name in ("pagedinfer", "json"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('decoy {name}')\n")
    code = "import json, pagedinfer.engine.child_python as m; print(json.dumps(m.__name__))"
    for argv in (child_python_argv(code=code), child_python_argv(module="json.tool", args=("--help",))):
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    decoyed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "decoy" in decoyed.stderr, "without -P the decoys are imported: this test would prove nothing"
