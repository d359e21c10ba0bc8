"""The images scripts/build_images.sh built, and processes run from them as a kubelet would.

`built_image(name)` reads build/images/<name>.json (written by the script:
tag, id, archive, sizes, the buildah storage flags). Without buildah, without
root, or without the built image, tests skip saying what to do, except in CI
(CI=true), where .ci/run builds the images first and a skip would hide a
failure.

`ImageContainer` runs a command from an image with `buildah run` (chroot
isolation, the host's network, so it reaches servers on 127.0.0.1) the way the
chart and the operator's pods run it: as the image's own USER, with the root
filesystem read-only (`readOnlyRootFilesystem: true`) and a writable scratch
directory at /tmp (their emptyDir). buildah has no read-only flag, so the
working container's root is bind-mounted read-only onto itself in a private
mount namespace before `buildah run` starts there; its /run is a scratch
directory too, where buildah puts /run/.containerenv (root-owned: the image's
user cannot write it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from dockerfiles import REPO

IMAGES_DIR = Path(os.environ.get("PAGEDINFER_IMAGES_DIR", REPO / "build" / "images"))


def skip_or_fail(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so image tests may not skip: .ci/run builds and installs what they need)")
    pytest.skip(message)


@dataclass(frozen=True)
class BuiltImage:
    name: str
    tag: str  # what the chart and the CRD name it
    dockerfile: str
    base: str  # the local base image it was built on
    from_image: str  # the base, or the base plus a cached apt layer (g++): the CPU engine's COMPILER_IMAGE
    id: str
    size_bytes: int  # unpacked: the sum of its layers
    archive: Path  # OCI archive for `kind load image-archive` / `ctr images import`
    archive_bytes: int
    seconds: dict[str, float]  # wheels, build, archive
    buildah: tuple[str, ...]  # `buildah <these flags> ...`: the script's own store

    def buildah_command(self, *args: str) -> list[str]:
        return ["buildah", *self.buildah, *args]

    def run_buildah(self, *args: str, timeout_seconds: float = 120) -> str:
        result = subprocess.run(self.buildah_command(*args), capture_output=True, text=True, timeout=timeout_seconds)
        if result.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def config(self, image: str | None = None) -> dict:
        """The OCI config (User, Env, Entrypoint, WorkingDir, ...) of this image, or of `image` in its store."""
        return json.loads(self.run_buildah("inspect", "--type", "image", image or self.tag))["OCIv1"]["config"]


def built_image(name: str) -> BuiltImage:
    """The image `name` as scripts/build_images.sh left it; skips (fails in CI) when it cannot be run."""
    if shutil.which("buildah") is None:
        skip_or_fail("buildah not installed (apt-get install buildah debootstrap), so no image is built")
    if os.geteuid() != 0:
        skip_or_fail("running images needs root (buildah's chroot isolation and a read-only bind mount)")
    manifest = IMAGES_DIR / f"{name}.json"
    if not manifest.is_file():
        skip_or_fail(f"no {manifest}: build the images first with `bash scripts/build_images.sh`")
    data = json.loads(manifest.read_text())
    image = BuiltImage(**{**data, "archive": Path(data["archive"]), "buildah": tuple(data["buildah"])})
    found = subprocess.run(
        image.buildah_command("inspect", "--type", "image", "--format", "{{.FromImageID}}", image.tag),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if found.returncode != 0 or found.stdout.strip() != image.id:
        skip_or_fail(f"{image.tag} ({image.id[:12]}) is not in the build store: rerun `bash scripts/build_images.sh`")
    return image


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    return children


@dataclass(frozen=True)
class WorkingContainer:
    """A buildah working container of an image, its root filesystem mounted on the host.

    Made once per image and session (with vfs, each is a full copy of the
    image): the processes run in it see its root read-only, so one run leaves
    nothing for the next but the mount points of its volumes.
    """

    image: BuiltImage  # whose store and flags
    ref: str  # the image it was made from (the image's tag, or its base)
    name: str
    root: Path

    @classmethod
    def create(cls, image: BuiltImage, ref: str | None = None) -> WorkingContainer:
        name = f"pagedinfer-test-{uuid.uuid4().hex[:12]}"
        image.run_buildah("from", "--pull-never", "--name", name, ref or image.tag, timeout_seconds=600)
        try:
            return cls(image, ref or image.tag, name, Path(image.run_buildah("mount", name).strip()))
        except BaseException:
            image.run_buildah("rm", name)
            raise

    def remove(self) -> None:
        self.image.run_buildah("rm", self.name)


class ImageContainer:
    """`command` in a working container as a pod runs it: the image's user, a read-only root, /tmp writable.

    `env` adds to the image's environment; `scratch` is a host directory
    holding /tmp (and buildah's /run); `volumes` maps more container paths
    (emptyDirs) to host directories, whose mount points are made in the
    container's own layer first, as a runtime does. Use as a context manager:
    the process is killed on exit if it still runs.
    """

    def __init__(
        self,
        container: WorkingContainer,
        command: list[str],
        scratch: Path,
        env: dict[str, str] | None = None,
        volumes: dict[str, Path] | None = None,
    ) -> None:
        self.container, self.command, self.env = container, command, env or {}
        self.tmp, self.run_dir = scratch / "tmp", scratch / "run"
        self.volumes = {"/tmp": self.tmp, **(volumes or {})}
        self.log_path = scratch / "container.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ImageContainer:
        root = self.container.root
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for path, host in self.volumes.items():
            host.mkdir(parents=True, exist_ok=True)
            host.chmod(0o1777)  # an emptyDir: writable by the image's user
            mount_point = root / path.lstrip("/")
            if not mount_point.resolve().is_relative_to(root.resolve()) or path.startswith(("/run", "/var/run")):
                raise ValueError(f"volume {path}: under /run, or a symbolic link out of the image")
            mount_point.mkdir(parents=True, exist_ok=True)
        run = self.container.image.buildah_command(
            "run",
            "--isolation",
            "chroot",
            "--network",
            "host",
            *(f"--volume={host}:{path}" for path, host in self.volumes.items()),
            *(f"--env={key}={value}" for key, value in self.env.items()),
            self.container.name,
            "--",
            *self.command,
        )
        read_only_root = (
            'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" '
            '&& mount --bind "$1" "$0/run" && shift && exec "$@"'
        )
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    read_only_root,
                    str(root),
                    str(self.run_dir),
                    *run,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
            )
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        if exc_type is not None:
            print(f"--- {' '.join(self.command)} in {self.container.ref}:\n{self.log()[-5000:]}")

    def log(self) -> str:
        """Everything the process (and buildah) wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def main_pid(self) -> int | None:
        """The command's own process (what a runtime signals), below buildah's chroot helpers; None before it runs."""
        assert self.process is not None
        children, pid = _children(), self.process.pid
        while True:
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                return None
            if not name.startswith(("buildah", "memfd:buildah", "unshare", "sh")):
                return pid
            if not children.get(pid):
                return None
            pid = children[pid][0]

    def terminate(self, timeout_seconds: float = 60) -> tuple[int, str]:
        """SIGTERM to the command, as the kubelet sends it; (its exit status, its output)."""
        assert self.process is not None
        pid = self.main_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        return self.process.wait(timeout=timeout_seconds), self.log()


@dataclass(frozen=True)
class ProcessView:
    """How a running process sees itself, read from /proc: who it is and what it may write."""

    uid: int  # effective
    gid: int
    capabilities: int  # the effective set, as a bit mask
    root_read_only: bool  # its / is mounted ro

    @classmethod
    def of(cls, pid: int) -> ProcessView:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        root_options = [
            line.split()[5]
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
            if line.split()[4] == "/"
        ][-1]  # the top mount on /, as the process sees it
        return cls(
            uid=int(status["Uid"].split()[1]),
            gid=int(status["Gid"].split()[1]),
            capabilities=int(status["CapEff"].strip(), 16),
            root_read_only="ro" in root_options.split(","),
        )
