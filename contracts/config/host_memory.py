"""Host memory this process can still take, for the host swap pool (`swap_space`).

The bound is the least of:
- `MemAvailable` in /proc/meminfo (what the kernel can hand out without swapping);
- for each memory cgroup the process is in, and each of its ancestors with a
  limit: limit - working set, where the working set is usage less inactive
  file cache (reclaimable, as the kubelet counts it). cgroup v2:
  memory.max / memory.current / memory.stat `inactive_file`; v1:
  memory.limit_in_bytes / memory.usage_in_bytes / memory.stat
  `total_inactive_file` (an "unlimited" v1 limit is a number near 2**63).

A container's pod limit shows up as its cgroup's limit, so a swap pool that
would be OOM-killed there is refused up front. Where nothing is readable (not
Linux) the bound is None and nothing is refused. Pure file reads; `root`
points the reads at a test tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_UNLIMITED_BYTES = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class HostMemoryBound:
    available_bytes: int
    source: str  # what bounds it, e.g. "MemAvailable" or "cgroup memory.max of /kubepods/pod1"


@dataclass(frozen=True)
class _CgroupFiles:
    base: str  # mount point, relative to root
    limit: str
    usage: str
    inactive_file_key: str  # in memory.stat


_V2 = _CgroupFiles("sys/fs/cgroup", "memory.max", "memory.current", "inactive_file")
_V1 = _CgroupFiles("sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def available_host_memory(root: Path = Path("/")) -> HostMemoryBound | None:
    """The tightest bound on the host memory this process can still allocate, or None if unknown."""
    bounds = []
    mem_available_kib = _stat_value(_read(root / "proc/meminfo"), "MemAvailable:")
    if mem_available_kib is not None:
        bounds.append(HostMemoryBound(mem_available_kib * 1024, "MemAvailable in /proc/meminfo"))
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            bounds += _cgroup_bounds(root, _V2, path)
        elif "memory" in controllers.split(","):
            bounds += _cgroup_bounds(root, _V1, path)
    return min(bounds, key=lambda b: b.available_bytes, default=None)


def _cgroup_bounds(root: Path, files: _CgroupFiles, path: str) -> list[HostMemoryBound]:
    """limit - working set of the process's cgroup and of each ancestor that has a limit."""
    bounds = []
    cgroup = PurePosixPath("/") / path.strip()
    for directory in (cgroup, *cgroup.parents):
        folder = root / files.base / str(directory).lstrip("/")
        limit = _int(_read(folder / files.limit))
        usage = _int(_read(folder / files.usage))
        if limit is None or limit >= _UNLIMITED_BYTES or usage is None:
            continue
        inactive_file = _stat_value(_read(folder / "memory.stat"), files.inactive_file_key + " ") or 0
        working_set = max(0, usage - inactive_file)
        bounds.append(HostMemoryBound(max(0, limit - working_set), f"cgroup {files.limit} of {directory}"))
    return bounds


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:  # "max": no limit
        return None


def _stat_value(text: str | None, key: str) -> int | None:
    """The first number after `key` at the start of a line (meminfo's `MemAvailable:`, memory.stat's)."""
    for line in (text or "").splitlines():
        if line.startswith(key):
            fields = line[len(key) :].split()
            return _int(fields[0]) if fields else None
    return None
