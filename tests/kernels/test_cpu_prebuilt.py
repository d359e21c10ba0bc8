"""A prebuilt native CPU library (kernels/cpu/build.py) loads as it is, writing nothing; one for other sources never.

`python -m pagedinfer.kernels.cpu.build --out DIR` (build_cli.main, in a
process of its own: it reuses the session's build in the extensions cache) installs
the library for these sources' hash; a fresh process finds it through
PAGEDINFER_CPU_KERNELS_DIR and loads it with every folder it could write to
read-only and no compiler (CXX=/bin/false), as the CPU engine image's pod
does. A folder holding only another hash's library is passed over: with no
compiler either, that process takes the torch path with the one warning.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagedinfer.kernels.cpu import build, build_cli

# Loads the kernels in a fresh process; with "attention", runs the native attention against the torch path
# (importing ops.py's custom ops costs seconds, so only where the library loads).
PROBE = """
import json, logging, sys, warnings
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import torch
from pagedinfer.kernels.cpu import build
build.PACKAGE_PREBUILT_DIR = Path(sys.argv[1])  # not the checkout's own prebuilt/, which a developer may fill
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loaded = build.load()
result = {"loaded": loaded, "origin": None if build.origin() is None else build.origin().kind,
          "library": None if build.origin() is None else str(build.origin().library),
          "warnings": [str(w.message) for w in caught],
          "registered": hasattr(torch.ops.pagedinfer, "cpu_attention_isa")}
if sys.argv[2:] == ["attention"]:
    from pagedinfer.kernels.cpu import ops, torch_attention
    from pagedinfer.kernels.problems import make_problem
    p = make_problem([9, 30], [1, 20], 6, 2, head_dim=16, block_size=8)
    out = ops.paged_attention(p.query, p.key_cache, p.value_cache, p.metadata, p.scale)
    expected = torch_attention.paged_attention(p.query, p.key_cache, p.value_cache, p.metadata, p.scale)
    result["max_error"] = float((out - expected).abs().max())
print(json.dumps(result))
"""


def probe(scratch: Path, kernels_dir: Path, cxx: str, *args: str) -> tuple[dict, str]:
    """(the probe's result, its stderr) in a fresh process whose HOME, extensions cache and package prebuilt/
    are the (empty) folders home, extensions and none of scratch."""
    folders = [scratch / name for name in ("home", "extensions", "none")]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(folders[0]),
        "TORCH_EXTENSIONS_DIR": str(folders[1]),
        "CXX": cxx,
        build.DIR_ENV: str(kernels_dir),
    }
    done = subprocess.run(
        [sys.executable, "-P", "-c", PROBE, str(folders[2]), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=scratch,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def session_library() -> Path:
    """The library this session loaded: where `build.origin()` says, else (a test that patched the build's
    state may have hidden the origin) the extensions cache's build for these sources."""
    if build.origin() is not None:
        return build.origin().library
    library = build.cached_library(build.extension_name())
    assert library.exists(), library
    return library


def tree(root: Path) -> list[tuple[str, int]]:
    """Every path under root with its modification time: what a process wrote there shows."""
    return sorted((str(path.relative_to(root)), path.lstat().st_mtime_ns) for path in root.rglob("*"))


@pytest.mark.slow  # the one proof of the prebuilt path: a fresh process importing the ops (5-18 s)
def test_an_installed_library_loads_from_read_only_folders_compiling_and_writing_nothing(native_cpu_kernels, tmp_path):
    prebuilt = tmp_path / "prebuilt"
    # In its own process, as an image build runs it: a build here that replaced the library this session
    # has loaded would load a second copy, whose op registrations abort the process.
    done = subprocess.run(
        [sys.executable, "-P", "-m", "pagedinfer.kernels.cpu.build", "--out", str(prebuilt)],
        capture_output=True,
        text=True,
        timeout=build.BUILD_WAIT_S,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    installed = prebuilt / f"{build.extension_name()}.so"
    assert done.stdout.strip().splitlines()[-1] == str(installed)
    assert [p.name for p in prebuilt.iterdir()] == [installed.name] and installed.stat().st_mode & 0o777 == 0o644
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for folder in ("home", "extensions", "none"):
        (scratch / folder).mkdir()
    before = tree(tmp_path)
    read_only = [prebuilt, *(scratch / name for name in ("home", "extensions", "none"))]
    try:
        for folder in read_only:
            folder.chmod(0o555)
        result, log = probe(scratch, prebuilt, "/bin/false", "attention")
    finally:
        for folder in read_only:
            folder.chmod(0o755)
    assert result["loaded"] and result["origin"] == "prebuilt" and result["library"] == str(installed), log
    assert result["registered"] and result["warnings"] == [], log
    assert result["max_error"] < 1e-5
    assert f"native CPU kernels: prebuilt library {installed}" in log
    assert tree(tmp_path) == before  # no lock, no build folder, no ninja log: nothing written anywhere


def test_a_folder_holding_only_another_hashs_library_is_passed_over(native_cpu_kernels, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copyfile(session_library(), other / "pagedinfer_cpu_kernels_000000000000.so")
    result, log = probe(tmp_path, other, str(tmp_path / "no-such-c++"))
    assert not result["loaded"] and result["origin"] is None and not result["registered"], log
    (warning,) = result["warnings"]
    assert "could not be built" in warning and f"none prebuilt for these sources is in {other}" in warning


def test_a_stamped_build_in_the_extensions_cache_loads_without_ninja_and_a_stale_one_is_built_again(
    native_cpu_kernels, tmp_path
):
    # As another checkout of the same sources left it: its build.ninja (which names that checkout's paths)
    # is not here, so ninja would rebuild; the stamp says the library is a finished build of this hash.
    name = build.extension_name()
    cached = tmp_path / "extensions" / name / build.library_filename(name)
    cached.parent.mkdir(parents=True)
    shutil.copyfile(session_library(), cached)
    build._write_stamp(cached)
    result, log = probe(tmp_path, tmp_path / "none", "/bin/false")  # no compiler: a build would fail
    assert result["loaded"] and result["origin"] == "cached" and result["library"] == str(cached), log
    assert result["warnings"] == [] and sorted(p.name for p in cached.parent.iterdir()) == [
        cached.name,
        f"{cached.name}.stamp",
    ]
    os.utime(cached, ns=(1, 1))  # replaced since its stamp (by an unstamped build): not trusted
    result, log = probe(tmp_path, tmp_path / "none", "/bin/false")
    assert not result["loaded"] and "could not be built" in result["warnings"][0], log


def test_the_first_folder_holding_this_hashs_library_is_the_one_found(monkeypatch, tmp_path):
    name = build.extension_name()
    explicit, package = tmp_path / "explicit", tmp_path / "package"
    for folder in (explicit, package):
        folder.mkdir()
    monkeypatch.setattr(build, "PACKAGE_PREBUILT_DIR", package)
    monkeypatch.setenv(build.DIR_ENV, str(explicit))
    assert build.find_prebuilt(name) is None
    (package / f"{name}.so").write_bytes(b"")
    (explicit / "pagedinfer_cpu_kernels_000000000000.so").write_bytes(b"")  # another version's
    assert build.find_prebuilt(name) == package / f"{name}.so"
    (explicit / f"{name}.so").write_bytes(b"")
    assert build.find_prebuilt(name) == explicit / f"{name}.so"
    monkeypatch.delenv(build.DIR_ENV)
    assert build.prebuilt_dirs() == [package] and build.find_prebuilt(name) == package / f"{name}.so"


def test_the_build_cli_rejects_an_out_that_is_not_a_folder_and_check_fails_without_a_library(
    monkeypatch, tmp_path, capsys
):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert build_cli.main(["--out", str(not_a_folder)]) == 2
    assert f"--out {not_a_folder} is not a directory" in capsys.readouterr().err
    monkeypatch.setattr(build, "PACKAGE_PREBUILT_DIR", tmp_path / "none")
    monkeypatch.setenv(build.DIR_ENV, str(tmp_path))
    assert build_cli.main(["--check"]) == 1
    assert f"no prebuilt {build.extension_name()}.so for these sources in {tmp_path}" in capsys.readouterr().err
