"""CPU time and memory of a process and its descendants, read from /proc (standard library only).

Shared by `throughput.py` (pagedinfer's venv) and `vllm_runner.py` (vLLM's
venv, whose engine core and model worker are child processes of the one that
calls `LLM.generate`). A process's CPU time is utime + stime of
/proc/<pid>/stat: every thread of it, in clock ticks. A tree is the process
and every descendant alive when it is read, found through parent pids; a
descendant that exited before the read is not counted, so read a tree's CPU
time before and after a timed span while its processes run, and subtract.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    parent_pid: int
    cpu_seconds: float  # utime + stime of all its threads


def read_stat(pid: int, proc_root: str | Path = "/proc") -> ProcStat | None:
    """The process's stat, or None once it is gone (or is not a process directory)."""
    try:
        text = (Path(proc_root) / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may itself hold ')' or spaces: split after the last one
    fields = text.rsplit(")", 1)[1].split()
    return ProcStat(pid, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND)


def tree(root_pid: int, proc_root: str | Path = "/proc") -> list[ProcStat]:
    """root_pid and its live descendants (any depth), root first; [] if root_pid is gone."""
    stats = {}
    for entry in Path(proc_root).iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc_root)
            if stat is not None:
                stats[stat.pid] = stat
    if root_pid not in stats:
        return []
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.parent_pid, []).append(stat.pid)
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(stats[pid])
        todo.extend(sorted(children.get(pid, ())))
    return found


def tree_cpu_seconds(root_pid: int, proc_root: str | Path = "/proc") -> float:
    """CPU seconds used so far by root_pid and its live descendants together."""
    return sum(s.cpu_seconds for s in tree(root_pid, proc_root))


def _status_bytes(pid: int, field: str, proc_root: str | Path) -> int:
    """A kB field of /proc/<pid>/status in bytes; 0 if unknown."""
    try:
        for line in (Path(proc_root) / str(pid) / "status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return 0


def peak_rss_bytes(pid: int, proc_root: str | Path = "/proc") -> int:
    """The process's peak resident set size (VmHWM of /proc/<pid>/status); 0 if unknown."""
    return _status_bytes(pid, "VmHWM", proc_root)


def rss_bytes(pid: int, proc_root: str | Path = "/proc") -> int:
    """The process's resident set size now (VmRSS of /proc/<pid>/status); 0 if unknown."""
    return _status_bytes(pid, "VmRSS", proc_root)


def resident_fraction(address: int, num_bytes: int) -> float:
    """Share of the pages of this process's [address, address + num_bytes) in memory (mincore(2)).

    Pages of an allocation never written are not resident (the host charges a page on first write).
    """
    page = mmap.PAGESIZE
    start = address - address % page
    length = address + num_bytes - start
    residency = (ctypes.c_ubyte * -(-length // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(start, length, residency) != 0:
        raise OSError(ctypes.get_errno(), f"mincore of {num_bytes} bytes at {address:#x}")
    return sum(byte & 1 for byte in residency) / len(residency)


def tree_peak_rss_bytes(root_pid: int, proc_root: str | Path = "/proc") -> int:
    """Sum of each live process's own peak RSS in the tree: an upper bound of the tree's peak
    (its processes need not peak at the same moment)."""
    return sum(peak_rss_bytes(s.pid, proc_root) for s in tree(root_pid, proc_root))
