"""Processes from /proc: whether one still runs, and the children of one."""

from __future__ import annotations

import time
from pathlib import Path


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat fields after the command name ([] once the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")  # a zombie awaiting its reaper has exited


def wait_gone(pids, seconds: float = 60.0) -> list[int]:
    """The pids still running after waiting up to `seconds` for them all to exit."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def children(parent: int, cmdline_contains: bytes = b"") -> set[int]:
    """Live child processes of `parent` whose command line contains `cmdline_contains`."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        fields = _stat(int(proc.name))
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if fields and fields[0] not in ("Z", "X") and int(fields[1]) == parent and cmdline_contains in cmdline:
            found.add(int(proc.name))
    return found
