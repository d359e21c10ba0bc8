"""This test process's share of the loopback addresses and ports, so that test processes run side by side
(pytest-xdist's workers) never pick the same one.

pytest-xdist runs a suite in N worker processes and tells each its place in the environment
(PYTEST_XDIST_WORKER "gw0" ... "gw<N-1>", PYTEST_XDIST_WORKER_COUNT N); the processes a test starts
inherit both, so they stay in their worker's share. Worker i takes the i-th of N equal, disjoint slices of:

- the loopback addresses 127.0.0.2 ... 127.0.0.254, given to pods and fake engines that all listen on
  the same port (kubelet_harness.loopback_ip: 8000); 127.0.0.1 is everyone's, with ports from below;
- the ports server_process.free_port hands out to child processes (below the kernel's ephemeral range).

A check "is it free?" followed by a bind in another process is a race between two workers drawing from
one range; with disjoint slices it can only be lost to a process of the same worker (as without xdist).
Outside xdist (one process) the share is everything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

LOOPBACK_OCTETS = range(2, 255)  # 127.0.0.x; .1 is everyone's, .255 the broadcast address


@dataclass(frozen=True)
class Share:
    """Slice `index` of `count` (0 <= index < count)."""

    index: int = 0
    count: int = 1

    def of(self, values: range) -> range:
        """This share's slice of `values`: disjoint from every other index's, together they cover `values`."""
        size = len(values)
        return values[size * self.index // self.count : size * (self.index + 1) // self.count]


def worker_share() -> Share:
    """The share of this process: its pytest-xdist worker's, else all (not under xdist, or an odd value)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return Share()
    index, total = int(worker[2:]), int(count)
    return Share(index, total) if 0 <= index < total else Share()


def loopback_octets() -> range:
    """The x of the 127.0.0.x addresses this process may give to servers on a shared port."""
    return worker_share().of(LOOPBACK_OCTETS)


def port_range(low: int, high: int) -> range:
    """This process's slice of the ports [low, high)."""
    return worker_share().of(range(low, high))
