"""The Dockerfiles in images/, read as data, and each image's install replayed as a pip dry run.

A dry run (`pip install --dry-run --ignore-installed --report`) over exactly
the files the Dockerfile COPYs resolves the image's whole package set without
building it; tests/images compares it with what a built image holds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = {
    "engine": REPO / "images" / "engine.Dockerfile",  # CUDA torch from its base
    "engine-cpu": REPO / "images" / "engine-cpu.Dockerfile",
    "operator": REPO / "images" / "operator.Dockerfile",
    "router": REPO / "images" / "router.Dockerfile",
}
PIP = Path(sys.executable).parent / "pip"
# The CUDA engine's dry run holds torch to its base image's release (as the
# image's own constraint does), which these machines hold locally as a CPU
# wheel, so no multi-GB CUDA build is fetched; triton to the release installed
# beside it.
TRITON_CONSTRAINT = "triton==3.8.0"


@dataclass(frozen=True)
class Dockerfile:
    bases: tuple[str, ...]  # FROM of each stage, ARGs substituted
    args: dict[str, str]  # every ARG's default
    final_user: str | None
    copies: tuple[str, ...]  # sources COPY'd from the build context
    install_extra: str  # the pagedinfer[extra] the final stage installs
    pins: tuple[str, ...]  # name==version requirements installed beside it, ARGs substituted
    text: str

    @classmethod
    def read(cls, path: Path) -> "Dockerfile":
        text = path.read_text()
        joined = re.sub(r"\\\n", " ", text)
        args = dict(re.findall(r"^ARG (\w+)=(\S+)", joined, re.M))

        def substitute(value: str) -> str:  # an ARG's default may name an earlier ARG
            while "${" in value:
                value = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)
            return value

        stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", joined, re.M)
        names = {name for _, name in stages if name}
        bases = tuple(substitute(base) for base, _ in stages if base not in names)  # images, not earlier stages
        users = re.findall(r"^USER (\S+)", joined, re.M)
        copies = tuple(src for line in re.findall(r"^COPY (?!--from)(.+)$", joined, re.M)
                       for src in line.split()[:-1])
        final_stage = _final_stage(joined)
        extras = re.findall(r"pagedinfer-\*\.whl\)\[(\w+)\]", final_stage)
        if len(extras) != 1:
            raise ValueError(f"{path.name}: expected one `pagedinfer-*.whl)[extra]` install in the final stage, "
                             f"found {extras}")
        pins = tuple(substitute(pin) for pin in re.findall(r'pip install [^\n]*?"([\w-]+==[^"]+)"', final_stage))
        return cls(bases, args, users[-1] if users else None, copies, extras[0], pins, text)


def _final_stage(joined: str) -> str:
    """What the image holds: the last stage's text, after the text of each earlier stage it starts FROM (a
    stage may build on a named one, `FROM runtime`); other stages (a build stage) may install too."""
    texts = {}
    for block in re.split(r"^(?=FROM )", joined, flags=re.M)[1:]:
        header = re.match(r"FROM (\S+)(?: AS (\w+))?", block)
        texts[header.group(2) or ""] = (header.group(1), block)
    base, text = texts[""]
    while base in texts:
        base, earlier = texts[base]
        text = earlier + text
    return text


def base_torch_version() -> str:
    """The torch release of the CUDA engine's base image, from its tag (pytorch/pytorch:<torch>-cuda...)."""
    tag = Dockerfile.read(IMAGES["engine"]).bases[-1].partition(":")[2]
    return tag.split("-", 1)[0]


def dry_run(image: str, tmp: Path) -> dict[str, str]:
    """Resolve the image's `pip install` over its COPY'd files: {name: version}."""
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
               "--report", "-", f".[{dockerfile.install_extra}]", *dockerfile.pins]
    if image == "engine":
        (tmp / "constraints.txt").write_text(f"torch=={base_torch_version()}\n{TRITON_CONSTRAINT}\n")
        command[2:2] = ["-c", str(tmp / "constraints.txt")]
    result = subprocess.run(command, cwd=context, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"{image}: pip could not resolve .[{dockerfile.install_extra}]:\n{result.stderr}")
    report = json.loads(result.stdout)
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()
