"""Without a prebuilt library and a working C++ compiler the CPU path falls back to the torch attention,
with one warning.

The loader's state is reset for the test (as in a fresh process), no folder
holds a prebuilt library (tests/kernels/test_cpu_prebuilt.py loads one), the
compiler named by CXX does not exist and the extensions cache is empty, so
the build must fail; the outputs must equal the torch path's exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from pagedinfer.kernels import dispatch, reference
from pagedinfer.kernels.cpu import build, torch_attention
from pagedinfer.kernels.problems import make_problem


def test_a_missing_compiler_falls_back_with_one_warning_and_the_torch_paths_output(
    native_cpu_kernels, monkeypatch, tmp_path
):
    # native_cpu_kernels: the real library is loaded first, so the failed build below cannot
    # make cpp_extension rebuild it under a new version for the tests that follow
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setattr(build, "_origin", None)
    monkeypatch.setattr(build, "PACKAGE_PREBUILT_DIR", tmp_path / "no-prebuilt")  # nor a library built before
    monkeypatch.delenv(build.DIR_ENV, raising=False)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setenv(dispatch.ENV_VAR, "auto")
    p = make_problem([9, 30], [1, 20], 6, 2, head_dim=16, block_size=8)
    key = torch.randn(p.metadata.num_tokens, 2, 16)
    caches = p.key_cache.clone(), p.value_cache.clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dispatch.write_kv(key, -key, *caches, p.metadata.slot_mapping)
        outs = [dispatch.paged_attention(p.query, *caches, p.metadata, p.scale, w) for w in (None, 5)]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert (
        "native CPU kernels (attention, layer ops) could not be built" in messages[0]
        and "using the slower torch path" in messages[0]
    )
    assert f"none prebuilt for these sources is in {tmp_path / 'no-prebuilt'}" in messages[0]
    assert build._loaded is False and build.origin() is None

    expected_caches = p.key_cache.clone(), p.value_cache.clone()
    reference.write_kv(key, -key, *expected_caches, p.metadata.slot_mapping)
    for out, window in zip(outs, (None, 5)):
        assert torch.equal(out, torch_attention.paged_attention(p.query, *expected_caches, p.metadata, p.scale, window))
    for cache, expected in zip(caches, expected_caches):
        assert torch.equal(cache.nan_to_num(), expected.nan_to_num())


def test_the_extension_is_named_after_its_sources_so_another_version_never_loads_this_ones(monkeypatch, tmp_path):
    # another checkout's (or an upgrade's) sources build into their own folder of the extensions cache
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for source in build.CSRC.iterdir():
        (csrc / source.name).write_bytes(source.read_bytes())
    original = build.extension_name()
    monkeypatch.setattr(build, "CSRC", csrc)
    assert build.extension_name() == original
    header = csrc / "attention.h"
    header.write_text(header.read_text() + "\n// another version\n")
    assert build.extension_name() != original and build.extension_name().startswith("pagedinfer_cpu_kernels_")


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next_load(tmp_path):
    # a build killed mid-way leaves torch's lock file in the extension's folder; torch's own loader waits on
    # it forever. Here the compiler is missing too, so the load must end at once, on the torch path.
    extensions = tmp_path / "extensions"
    folder = extensions / build.extension_name()
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "CXX": str(tmp_path / "no-such-c++")}
    env.pop(build.DIR_ENV, None)
    load = (
        "from pathlib import Path; from pagedinfer.kernels.cpu import build; "
        f"build.PACKAGE_PREBUILT_DIR = Path({str(tmp_path / 'no-prebuilt')!r}); print(build.load())"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-P", "-c", load], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
    except subprocess.TimeoutExpired:
        pytest.fail("load() waited on the lock file of a build that no longer runs")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False" and "could not be built" in done.stderr
    assert not (folder / "lock").exists()


def test_a_build_running_elsewhere_is_waited_for_a_bounded_time(tmp_path):
    with build._exclusive_build(tmp_path, wait_s=1.0):  # another build of the same folder holds the lock
        with pytest.raises(TimeoutError, match=f"another process has been building {tmp_path}"):
            with build._exclusive_build(tmp_path, wait_s=0.3):
                pass
    with build._exclusive_build(tmp_path, wait_s=0.3):  # released with its holder
        pass
