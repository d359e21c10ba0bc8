"""The tree's lint and format (pyproject.toml's [tool.ruff]) and its layering ([tool.importlinter]), run by
the test command so CI runs them too.

`ruff check .` and `ruff format --check .` from the repository root; fix with `ruff check --fix .` and
`ruff format .` (the venv's ruff: `.venv/bin/ruff`).

The layering: `lint-imports pyproject.toml` (the venv's), run from an empty directory, never the repository
root: lint-imports puts its working directory on sys.path, where our `operator/` would shadow the standard
library's. grimp finds each `pagedinfer.*` folder through the editable install. Each contract was seen to
fail (a router module importing the operator, a contracts module importing the engine, the kernels
importing the engine, an operator function importing transformers or, through contracts, fastapi, the
engine importing pagedinfer.testing: each reported BROKEN with its chain of imports, exit 1);
`test_the_layering_check_sees_the_imports` keeps that true: contracts our code breaks are reported broken.
"""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize(
    "args", [["check", "--output-format", "concise", "."], ["format", "--check", "."]], ids=["check", "format"]
)
def test_ruff_passes_on_the_whole_tree(args):
    done = subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff {' '.join(args)}:\n{done.stdout}{done.stderr}"


def _lint_imports(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(config)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_layering_holds(tmp_path):
    """engine, router and operator on contracts (none importing another), kernels under the engine, and no
    torch, transformers or triton in contracts, router or operator (their images have none)."""
    done = _lint_imports(ROOT / "pyproject.toml", tmp_path)
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(contracts)} kept, 0 broken." in done.stdout, done.stdout


def test_every_package_folder_is_a_root_of_the_layering():
    """A new top-level folder (a package-dir entry) is checked too."""
    folders = set(PYPROJECT["tool"]["setuptools"]["package-dir"])
    assert set(PYPROJECT["tool"]["importlinter"]["root_packages"]) == folders


def test_the_layering_check_sees_the_imports(tmp_path):
    """Not a vacuous pass: with the same roots, contracts that our code does break are reported broken (the
    router imports contracts directly; the operator's cli reaches prometheus_client only inside a function
    and through its own modules: lazy and indirect imports count)."""
    roots = "\n".join(f"    {r}" for r in PYPROJECT["tool"]["importlinter"]["root_packages"])
    config = tmp_path / "broken.ini"
    config.write_text(
        f"[importlinter]\nroot_packages =\n{roots}\ninclude_external_packages = True\n\n"
        "[importlinter:contract:router-without-contracts]\nname = router without contracts\ntype = forbidden\n"
        "source_modules = pagedinfer.router\nforbidden_modules = pagedinfer.contracts\n\n"
        "[importlinter:contract:cli-without-prometheus]\nname = operator cli without prometheus\ntype = forbidden\n"
        "source_modules = pagedinfer.operator.cli\nforbidden_modules = prometheus_client\n"
    )
    done = _lint_imports(config, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 0 kept, 2 broken." in done.stdout, done.stdout
