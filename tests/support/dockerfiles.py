"""The Dockerfiles in images/, read as data, and each image's install replayed as a pip dry run.

Every image installs its lock (requirements/<image>.lock: `pip install --require-hashes --no-deps -r`),
then the pagedinfer wheel with `--no-index`, whose extra's requirements only the lock's packages can meet.
The replay does the same without building: pip downloads the lock's files (each checked against its
sha256, as scripts/build_images.sh does for the build), then resolves the wheel's `.[extra]`, over exactly
the files the Dockerfile COPYs, from those files alone. tests/images compares the result with the lock and
with what a built image holds.
"""

from __future__ import annotations

import json
import os
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
# The lock each image installs. The CUDA engine installs the CPU engine's less its torch line: the
# rest of pagedinfer[gpu] is what its base lacks (images/engine.Dockerfile says why).
LOCKS = {
    "engine": "requirements/engine-cpu.lock",
    "engine-cpu": "requirements/engine-cpu.lock",
    "operator": "requirements/operator.lock",
    "router": "requirements/router.lock",
}
DEV_LOCK = "requirements/dev.lock"
# requirements/build.in: in every lock with their own requirements (wheel's packaging), which the wheel
# stage installs to build with.
BUILD_REQUIREMENTS = ("pip", "setuptools", "wheel")
PIP = Path(sys.executable).parent / "pip"
# The CUDA engine's base brings torch and the triton its CUDA wheel pins. The replay stands them in by
# release: torch at the base's (these machines hold it locally as the CPU wheel, so no multi-GB CUDA build
# is fetched), triton at the release installed beside it.
TRITON_CONSTRAINT = "triton==3.8.0"


@dataclass(frozen=True)
class Dockerfile:
    bases: tuple[str, ...]  # FROM of each stage, ARGs substituted
    args: dict[str, str]  # every ARG's default
    final_user: str | None
    copies: tuple[str, ...]  # sources COPY'd from the build context
    stages: dict[str, str]  # each stage's text by name; the final stage's under "", after the stages it starts FROM
    lock: str  # the requirements/*.lock it COPYs
    lock_filter: str | None  # the awk program the final stage runs over the lock before installing it
    install_extra: str  # the pagedinfer[extra] the final stage installs
    text: str

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
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
        copies = tuple(src for line in re.findall(r"^COPY (?!--from)(.+)$", joined, re.M) for src in line.split()[:-1])
        locks = sorted({src for src in copies if src.endswith(".lock")})
        if len(locks) != 1:
            raise ValueError(f"{path.name}: expected one requirements/*.lock among its COPYs, found {locks}")
        texts = _stages(joined)
        extras = re.findall(r"pagedinfer-\*\.whl\)\[(\w+)\]", texts[""])
        if len(extras) != 1:
            raise ValueError(
                f"{path.name}: expected one `pagedinfer-*.whl)[extra]` install in the final stage, found {extras}"
            )
        filters = re.findall(rf"awk '([^']+)' \S*/{re.escape(Path(locks[0]).name)}", texts[""])
        if len(filters) > 1:
            raise ValueError(f"{path.name}: expected at most one awk over the lock in the final stage: {filters}")
        return cls(
            bases,
            args,
            users[-1] if users else None,
            copies,
            texts,
            locks[0],
            filters[0] if filters else None,
            extras[0],
            text,
        )

    def pip_commands(self, stage: str = "") -> list[str]:
        """Each `pip install` and `pip wheel` of a stage (the final one by default), up to its `&&`."""
        return re.findall(r"pip (?:install|wheel) [^&\n]*", self.stages[stage])

    def installed_lock(self) -> str:
        """The lock's text as the final stage installs it: through its awk program, if it has one."""
        text = (REPO / self.lock).read_text()
        if self.lock_filter is None:
            return text
        return subprocess.run(
            ["awk", self.lock_filter], input=text, capture_output=True, text=True, check=True, timeout=60
        ).stdout


def _stages(joined: str) -> dict[str, str]:
    """Each stage's text by name, the final (unnamed) one under "": what the image holds, the last stage's
    text after the text of each earlier stage it starts FROM (a stage may build on a named one,
    `FROM runtime`); other stages (a build stage) may install too."""
    texts = {}
    for block in re.split(r"^(?=FROM )", joined, flags=re.M)[1:]:
        header = re.match(r"FROM (\S+)(?: AS (\w+))?", block)
        texts[header.group(2) or ""] = (header.group(1), block)
    stages = {name: text for name, (_, text) in texts.items()}
    base, text = texts[""]
    while base in texts:
        base, earlier = texts[base]
        text = earlier + text
    stages[""] = text
    return stages


def base_torch_version() -> str:
    """The torch release of the CUDA engine's base image, from its tag (pytorch/pytorch:<torch>-cuda...)."""
    tag = Dockerfile.read(IMAGES["engine"]).bases[-1].partition(":")[2]
    return tag.split("-", 1)[0]


# A lock's requirement line: `name==version` or, with extras (uv keeps them), `name[extra, ...]==version`.
PIN = r"^([A-Za-z0-9][\w.-]*)(?:\[[^\]\n]*\])?==(\S+)"


def lock_pins(text: str) -> dict[str, str]:
    """{canonical name: version} of a lock's `name==version` lines."""
    return {canonical(name): version for name, version in re.findall(PIN, text, re.M)}


def base_packages(image: str) -> tuple[str, ...]:
    """What the image's base brings that its install needs: the CUDA engine's torch and triton."""
    return (f"torch=={base_torch_version()}", TRITON_CONSTRAINT) if image == "engine" else ()


@dataclass(frozen=True)
class Install:
    """An image's install, replayed."""

    lock: dict[str, str]  # {name: version} the lock install puts in (the lock, through the Dockerfile's filter)
    wheel: dict[str, str]  # what the wheel's install resolves from the lock's files (and the base's stand-ins)
    build: dict[str, str]  # what BUILD_REQUIREMENTS resolve to from the lock's files: their closure

    @property
    def packages(self) -> dict[str, str]:
        """Everything the image adds to its base."""
        return {**self.lock, **self.wheel}


def dry_run(image: str, tmp: Path) -> Install:
    """Replay the image's install over its COPY'd files: the lock's files downloaded by their hashes, then the
    wheel's `.[extra]` resolved from those files alone."""
    dockerfile = Dockerfile.read(IMAGES[image])
    context = tmp / image
    context.mkdir()
    for src in dockerfile.copies:
        source = REPO / src
        if not source.exists():
            raise AssertionError(f"{IMAGES[image].name} COPYs {src}, which does not exist in the repository")
        (context / src).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, context / src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, context / src)
    lock = tmp / f"{image}.lock"
    lock.write_text(dockerfile.installed_lock())
    wheels = tmp / f"{image}-wheels"
    torch_index = os.environ.get("PAGEDINFER_TORCH_INDEX_URL")
    sources = ["--extra-index-url", torch_index] if torch_index else []
    # This machine's pip configuration (find-links, index) finds the files, as for scripts/build_images.sh.
    _pip(
        image,
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--no-deps",
        "--require-hashes",
        *sources,
        "--dest",
        str(wheels),
        "-r",
        str(lock),
        cwd=tmp,
    )
    if base_packages(image):
        _pip(
            image,
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--no-deps",
            *sources,
            "--dest",
            str(wheels),
            *base_packages(image),
            cwd=tmp,
        )
    wheel = _resolve(image, wheels, f".[{dockerfile.install_extra}]", cwd=context)
    build = _resolve(image, wheels, *BUILD_REQUIREMENTS, cwd=tmp)
    return Install(lock_pins(lock.read_text()), wheel, build)


def _resolve(image: str, wheels: Path, *requirements: str, cwd: Path) -> dict[str, str]:
    """{name: version} pip would install for the requirements from the files in `wheels` alone (--isolated:
    no find-links or index from this machine's configuration)."""
    report = _pip(
        image,
        "--isolated",
        "install",
        "--dry-run",
        "--quiet",
        "--ignore-installed",
        "--no-build-isolation",
        "--no-index",
        "--find-links",
        str(wheels),
        "--report",
        "-",
        *requirements,
        cwd=cwd,
    )
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in json.loads(report)["install"]}


def _pip(image: str, *args: str, cwd: Path) -> str:
    result = subprocess.run([str(PIP), *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise AssertionError(f"{image}: pip {' '.join(args)}\n{result.stderr}")
    return result.stdout


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()
