"""CPU time and peak memory of a process and its descendants, read from /proc (standard library only).

Shared by `throughput.py` (pagedinfer's venv) and `vllm_runner.py` (vLLM's
venv, whose engine core and model worker are child processes of the one that
calls `LLM.generate`). A process's CPU time is utime + stime of
/proc/<pid>/stat: every thread of it, in clock ticks. A tree is the process
and every descendant alive when it is read, found through parent pids; a
descendant that exited before the read is not counted, so read a tree's CPU
time before and after a timed span while its processes run, and subtract.
"""

from __future__ import annotations

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


def peak_rss_bytes(pid: int, proc_root: str | Path = "/proc") -> int:
    """The process's peak resident set size (VmHWM of /proc/<pid>/status); 0 if unknown."""
    try:
        for line in (Path(proc_root) / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return 0


def tree_peak_rss_bytes(root_pid: int, proc_root: str | Path = "/proc") -> int:
    """Sum of each live process's own peak RSS in the tree: an upper bound of the tree's peak
    (its processes need not peak at the same moment)."""
    return sum(peak_rss_bytes(s.pid, proc_root) for s in tree(root_pid, proc_root))
