"""The project installs as one `pagedinfer` namespace and never shadows the stdlib."""

import importlib
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_stdlib_operator_is_not_shadowed():
    import operator

    assert operator.eq(1, 1)
    assert Path(operator.__file__).resolve().parent == Path(sysconfig.get_paths()["stdlib"]).resolve()


def test_repo_root_is_not_on_sys_path():
    assert str(REPO) not in [str(Path(p).resolve()) for p in sys.path if p]


def test_three_folders_form_one_namespace():
    for name, folder in (("engine", "engine"), ("kernels", "kernels"), ("operator", "operator")):
        module = importlib.import_module(f"pagedinfer.{name}")
        assert Path(module.__file__).resolve().parent == REPO / folder


def test_operator_imports_no_torch_transformers_or_triton():
    code = (
        "import sys, pagedinfer.operator, pagedinfer.engine.sizing\n"
        "import importlib.util\n"
        "spec = importlib.util.find_spec('pagedinfer.operator.cli')\n"
        "if spec: import pagedinfer.operator.cli\n"
        "bad = sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_stdlib_operator_from_a_subprocess_started_in_the_repo_root():
    # The console scripts and `python -P` never add the cwd to sys.path.
    out = subprocess.run([sys.executable, "-P", "-c", "import operator; print(operator.eq.__module__)"],
                         cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()
    assert out in ("_operator", "operator")
