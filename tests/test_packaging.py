"""The project installs as one `pagedinfer` namespace and never shadows the stdlib."""

import ast
import importlib
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def test_stdlib_operator_is_not_shadowed():
    import operator

    assert operator.eq(1, 1)
    assert Path(operator.__file__).resolve().parent == Path(sysconfig.get_paths()["stdlib"]).resolve()


def test_repo_root_is_not_on_sys_path():
    assert str(REPO) not in [str(Path(p).resolve()) for p in sys.path if p]


def test_the_folders_form_one_namespace():
    for name, folder in (
        ("contracts", "contracts"),
        ("engine", "engine"),
        ("kernels", "kernels"),
        ("operator", "operator"),
        ("router", "router"),
        ("testing", "testing"),
    ):
        module = importlib.import_module(f"pagedinfer.{name}")
        assert Path(module.__file__).resolve().parent == REPO / folder


def test_stdlib_operator_from_python_started_in_the_repo_root_with_the_cwd_on_sys_path():
    """`python -c` (and `python -m`) in the repo root put the cwd first on sys.path, in front of our operator/.
    `import operator` is still the stdlib's: the interpreter imports it while starting up (site), before the
    cwd is consulted. docs/design.md ("Packaging") says what the project cannot guarantee (`python -S`)."""
    code = "import operator, sys; print(sys.path[0] == ''); print(operator.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split("\n")
    assert out[0] == "True", "the cwd is not on sys.path: this check would prove nothing"
    assert Path(out[1]).resolve().parent == Path(sysconfig.get_paths()["stdlib"]).resolve(), out[1]


def test_no_installed_path_or_finder_maps_plain_operator_to_our_folder():
    """With the cached module set aside, a fresh lookup of `operator` through every installed finder (the
    editable install's, .pth entries, site-packages) finds the stdlib; from the repo root only the cwd entry
    would find our folder."""
    code = (
        "import importlib.util, sys\n"
        "sys.modules.pop('operator')\n"
        "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
        "print(importlib.util.find_spec('operator').origin)\n"
        "print(importlib.util.find_spec('pagedinfer.operator').origin)\n"
    )
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    for cwd in ("/", REPO):
        plain, ours = subprocess.run(
            [sys.executable, "-P", "-c", code], cwd=cwd, check=True, capture_output=True, text=True
        ).stdout.split("\n")[:2]
        assert Path(plain).resolve().parent == stdlib, (cwd, plain)
        assert Path(ours).resolve() == REPO / "operator" / "__init__.py", ours  # the lookup does reach our folder


def _module_file(name: str) -> Path | None:
    """Our source file for module `pagedinfer.<folder>....`, or None when it is not one."""
    parts = name.split(".")
    if parts[0] != "pagedinfer" or len(parts) < 2:
        return None
    base = REPO.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _served_files(folders: list[str]) -> set[Path]:
    """The folders' files and every module of ours they import, transitively (the router's KV feed decodes
    with engine/kv_events: its imports are the router's too)."""
    todo = [p for f in folders for p in (REPO / f).rglob("*.py")]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            todo += [f for f in map(_module_file, names) if f is not None]
    return seen


def _third_party_imports_of_files(paths: set[Path]) -> set[str]:
    """Top-level modules the files import (lazy imports in functions too), minus stdlib and ours."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"pagedinfer", "__future__"}


def _with_dependencies(requirements: list[str]) -> set[str]:
    """The distributions the requirements install, transitively (as installed here)."""
    seen, stack = set(), [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            stack.extend(Requirement(r) for r in metadata.requires(name) or ())
        except metadata.PackageNotFoundError:
            pass
    return seen


def _extra_requirements(extra: str) -> list[str]:
    """The requirements `pagedinfer[extra]` installs, its own `pagedinfer[other]` entries expanded."""
    declared = [Requirement(r) for r in metadata.requires("pagedinfer") or ()]
    requirements = []
    for r in declared:
        if not (r.marker and r.marker.evaluate({"extra": extra}) and not r.marker.evaluate({"extra": ""})):
            continue
        if canonicalize_name(r.name) == "pagedinfer":
            requirements += [req for other in sorted(r.extras) for req in _extra_requirements(other)]
        else:
            requirements.append(str(r).split(";")[0])
    return requirements


# Imports that only the Triton kernel modules make: kernels/dispatch.py imports
# them on first use with CUDA tensors, so the CPU engine ([engine]) goes without.
GPU_ONLY_IMPORTS = {"triton"}


@pytest.mark.parametrize(
    "extra, folders, absent_allowed",
    [
        ("gpu", ["engine", "kernels"], set()),
        ("engine", ["engine", "kernels"], GPU_ONLY_IMPORTS),
        ("operator", ["operator"], set()),
        ("router", ["router"], set()),
        ("testing", ["testing"], set()),
    ],
)
def test_every_module_the_code_imports_comes_with_its_extra(extra, folders, absent_allowed):
    """An image installs `.[gpu]`, `.[engine]` or `.[operator]` only: an import outside it fails there, not here.
    The folders' own modules and every module of ours they import (pagedinfer.contracts above all) count."""
    requirements = _extra_requirements(extra)
    assert requirements, f"no [{extra}] extra in the installed metadata"
    provided = _with_dependencies(requirements)
    owners = metadata.packages_distributions()
    missing = {}
    for module in _third_party_imports_of_files(_served_files(folders)) - absent_allowed:
        dists = {canonicalize_name(d) for d in owners.get(module, [module])}
        if not dists & provided:
            missing[module] = sorted(dists)
    assert not missing, f"imported but not installed by the [{extra}] extra: {missing}"


@pytest.mark.parametrize(
    "extra, folders",
    [
        ("engine", ["engine", "kernels"]),
        ("gpu", ["engine", "kernels"]),
        ("operator", ["operator"]),
        ("router", ["router"]),
        ("testing", ["testing"]),
    ],
)
def test_every_dependency_an_extra_declares_is_imported_by_the_code_it_serves(extra, folders):
    """The converse of the test above: a declared distribution that no module of the extra's code (or of ours
    that it imports) imports is dead weight in its image. Another extra it includes is checked on its own."""
    declared = [Requirement(r) for r in metadata.requires("pagedinfer") or ()]
    direct = [
        r
        for r in declared
        if r.marker
        and r.marker.evaluate({"extra": extra})
        and not r.marker.evaluate({"extra": ""})
        and canonicalize_name(r.name) != "pagedinfer"
    ]
    assert direct, f"no [{extra}] requirements in the installed metadata"
    modules_of: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            modules_of.setdefault(canonicalize_name(dist), set()).add(module)
    imported = _third_party_imports_of_files(_served_files(folders))
    unused = sorted(r.name for r in direct if not modules_of.get(canonicalize_name(r.name), set()) & imported)
    assert not unused, f"[{extra}] declares what its code never imports: {unused}"


def _venv_with_only(tmp_path: Path, extra: str) -> Path:
    """A fresh venv holding pagedinfer and exactly the distributions its `extra` installs; its python.

    The distributions are linked from this environment's site-packages (same
    versions, no index needed), so torch and everything else outside the
    extra is genuinely absent there, as in an operator image.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-P", "-m", "venv", "--without-pip", str(venv)], check=True, cwd="/")
    python = venv / "bin" / "python"
    target = Path(
        subprocess.run(
            [str(python), "-P", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            cwd="/",
        ).stdout.strip()
    )
    ours = metadata.distribution("pagedinfer")
    site = Path(ours.locate_file(""))
    entries = {p.name for p in site.iterdir() if "pagedinfer" in p.name}  # the dist-info and the editable finder
    declared = [Requirement(r) for r in metadata.requires("pagedinfer") or ()]
    requirements = [
        str(r).split(";")[0]
        for r in declared
        if r.marker and r.marker.evaluate({"extra": extra}) and not r.marker.evaluate({"extra": ""})
    ]
    for name in _with_dependencies(requirements):
        for file in metadata.distribution(name).files or ():
            if file.parts[0] != ".." and (site / file.parts[0]).exists():
                entries.add(file.parts[0])
    for entry in entries:
        (target / entry).symlink_to(site / entry)
    return python


def test_engine_commands_in_an_operator_only_install_name_the_extra(tmp_path):
    python = _venv_with_only(tmp_path, "operator")
    cli = "import sys; from pagedinfer.engine.cli import main; sys.exit(main())"  # what the console script runs

    def pagedinfer(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(python), "-P", "-c", cli, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120
        )

    assert subprocess.run([str(python), "-P", "-c", "import torch"], capture_output=True, cwd=tmp_path).returncode != 0
    assert subprocess.run([str(python), "-P", "-c", "import kopf"], cwd=tmp_path).returncode == 0
    listed = pagedinfer("--help")
    # every subcommand's module imports without torch (the router image runs `pagedinfer router` this way too)
    assert listed.returncode == 0, listed.stderr
    assert all(c in listed.stdout for c in ("generate", "plan", "serve", "bench", "operator", "router")), listed.stdout
    for argv in (["serve"], ["generate", "--prompt", "hi"], ["bench", "serve", "--url", "http://127.0.0.1:1"]):
        proc = pagedinfer(*argv)
        assert proc.returncode == 2, (argv, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert f"pagedinfer {argv[0]}: error: needs the 'engine' extra" in lines[0]
        assert "pip install 'pagedinfer[engine]'" in lines[0]
    assert pagedinfer("operator", "--help").returncode == 0


def test_every_subpackage_is_listed_for_setuptools():
    """A folder with an __init__.py missing from [tool.setuptools] packages is left out of the wheel."""
    import re

    listed = set(
        re.findall(
            r'"(pagedinfer\.[\w.]+)"', (REPO / "pyproject.toml").read_text().split("packages = [")[1].split("]")[0]
        )
    )
    found = {
        "pagedinfer." + ".".join(init.parent.relative_to(REPO).parts)
        for folder in ("contracts", "engine", "kernels", "operator", "router", "testing")
        for init in (REPO / folder).rglob("__init__.py")
    }
    assert found == listed


def test_the_cpu_engine_generates_without_triton():
    """What lets [engine] (the CPU engine image) leave out triton: with it unimportable, as there, a CPU
    generation runs (torch only probes for it; our kernels import it for CUDA tensors alone)."""
    code = (
        "import sys\n"
        "sys.modules.update(dict.fromkeys(%r))  # `import triton` raises ImportError\n"
        "from pagedinfer.contracts.embedded_model import default_model_dir\n"
        "from pagedinfer.engine.llm import LLM\n"
        "from pagedinfer.engine.sampling_params import SamplingParams\n"
        "llm = LLM(model=str(default_model_dir()))\n"
        "out = llm.generate(['Hello'], SamplingParams(temperature=0.0, max_tokens=4))\n"
        "assert len(out[0].outputs[0].token_ids) == 4, out\n" % sorted(GPU_ONLY_IMPORTS)
    )
    subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd="/", timeout=240)


def test_nothing_outside_tests_reaches_into_tests_support():
    """bench/ and the packages import test support from pagedinfer.testing; tests/support is tests' own (it is
    on sys.path only under pytest, through tests/conftest.py)."""
    support = {p.stem for p in (REPO / "tests" / "support").glob("*.py")}
    offenders = []
    for folder in ("bench", "contracts", "engine", "kernels", "operator", "router", "testing", "scripts"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            if _third_party_imports_of_files({path}) & support or '"support"' in text or "tests/support" in text:
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"these reach into tests/support: {offenders}"
