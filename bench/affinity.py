"""Pin a benchmark, and every process it starts, to a set of CPUs (`throughput.py --cpus`).

A CPU list is Linux's cpuset syntax, as `taskset -c` takes it: comma-separated
CPU ids and inclusive ranges ("0", "0-3", "0,2,4-5"). `pin` sets the calling
process's affinity; Linux copies it to every child at fork, and exec keeps it,
so each system's process, the processes it starts (vLLM's engine core
included) and their threads run on those CPUs only, unless one of them sets
its own affinity: `vllm_runner.py` runs vLLM with
`VLLM_CPU_OMP_THREADS_BIND=nobind`, so its worker keeps the inherited set.
"""

from __future__ import annotations

import argparse
import os


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPU ids of a cpuset list; ArgumentTypeError naming the bad part, or CPUs this process cannot use."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or (last and int(last) < int(first)):
            raise argparse.ArgumentTypeError(f"--cpus: {part!r} is not a CPU id or a range like 0-3 (got {text!r})")
        cpus.update(range(int(first), int(last or first) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise argparse.ArgumentTypeError(
            f"--cpus: CPU {format_cpu_list(cpus - allowed)} not available to this "
            f"process (it may use {format_cpu_list(allowed)})"
        )
    return frozenset(cpus)


def format_cpu_list(cpus) -> str:
    """The shortest cpuset list of `cpus`: {0, 1, 2, 5} -> "0-2,5"."""
    ordered, runs = sorted(cpus), []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def pin(cpus: frozenset[int] | None) -> str:
    """Pin this process (and so every process it starts from now on) to `cpus`; None leaves it. Says which."""
    if cpus is None:
        return f"not pinned (may use cpus {format_cpu_list(os.sched_getaffinity(0))})"
    os.sched_setaffinity(0, cpus)
    return f"every system pinned to cpus {format_cpu_list(os.sched_getaffinity(0))}"
