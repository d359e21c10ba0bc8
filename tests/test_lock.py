"""The locks in requirements/ against pyproject.toml and the installed venv.

- every lock pins each package once, exactly (`==`), with at least one sha256;
- every requirement pyproject.toml states for an extra is met by the pin of the lock that installs that extra
  (a lock left behind by a changed range is caught here, not by a user);
- the image locks agree with dev.lock on every package they share (an image runs what the suite tested);
- the venv the suite runs in holds exactly dev.lock's versions (scripts/setup.sh installed the lock).
"""

from __future__ import annotations

import re
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "requirements"
# Which extras each lock installs.
LOCK_EXTRAS = {
    "dev.lock": ("dev",),
    "engine-cpu.lock": ("engine",),
    "operator.lock": ("operator",),
    "router.lock": ("router",),
}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)")


def read_lock(name: str) -> dict[str, Version]:
    """{canonical name: version} of a lock; each entry checked to be `==` with hashes."""
    pins: dict[str, Version] = {}
    entry: str | None = None
    hashes = 0
    for line in (LOCKS / name).read_text().splitlines():
        if not line or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            match = PIN.match(line)
            assert match, f"{name}: not an exact pin: {line!r}"
            assert entry is None or hashes, f"{name}: {entry} has no hash"
            entry, hashes = canonicalize_name(match.group(1)), 0
            assert entry not in pins, f"{name}: {entry} pinned twice"
            pins[entry] = Version(match.group(3))
        elif "--hash=sha256:" in line:
            hashes += 1
    assert entry is None or hashes, f"{name}: {entry} has no hash"
    return pins


def extra_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The requirements of `extras`, following pagedinfer's own extras (`pagedinfer[gpu,...]`)."""
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    seen: set[str] = set()
    out: list[Requirement] = []
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in table[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "pagedinfer":
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


@pytest.mark.parametrize("lock", sorted(LOCK_EXTRAS))
def test_the_lock_meets_every_requirement_of_its_extras(lock):
    pins = read_lock(lock)
    env = {"python_version": "3.11", "platform_system": "Linux", "sys_platform": "linux"}
    for req in extra_requirements(LOCK_EXTRAS[lock]):
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{lock} lacks {req} (run bash scripts/lock.sh)"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{lock} pins {name}=={pins[name]}, outside pyproject's {req} (run bash scripts/lock.sh)"
        )


@pytest.mark.parametrize("lock", ["engine-cpu.lock", "operator.lock", "router.lock"])
def test_an_image_lock_agrees_with_dev_lock(lock):
    dev, image = read_lock("dev.lock"), read_lock(lock)
    differ = {name: (str(version), str(dev.get(name))) for name, version in image.items() if dev.get(name) != version}
    assert not differ, f"{lock} differs from dev.lock (image, dev): {differ}"


def test_the_venv_holds_exactly_dev_lock():
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip(f"not the project's venv ({sys.prefix}: scripts/versions.sh installs other versions on purpose)")
    pins = read_lock("dev.lock")
    # site-packages only: once setuptools is imported, its vendored packages (_vendor/*.dist-info) are on sys.path too.
    site = sysconfig.get_paths()["purelib"]
    installed = {
        canonicalize_name(dist.metadata["Name"]): Version(dist.version) for dist in metadata.distributions(path=[site])
    }
    installed.pop("pagedinfer", None)
    assert {name: installed.get(name) for name in pins} == pins
    assert set(installed) - set(pins) == set(), "installed but not locked"
