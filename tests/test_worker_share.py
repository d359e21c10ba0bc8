"""Each pytest-xdist worker draws loopback addresses and ports from its own slice (testing/worker_share.py)."""

from __future__ import annotations

import pytest

from pagedinfer.testing import server_process, worker_share
from pagedinfer.testing.kubelet_harness import loopback_ip
from pagedinfer.testing.worker_share import LOOPBACK_OCTETS, Share


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_the_shares_are_disjoint_and_cover_every_value(count):
    values = range(20000, 32768)
    slices = [Share(i, count).of(values) for i in range(count)]
    assert [v for s in slices for v in s] == list(values)
    assert all(len(s) >= len(values) // count for s in slices)


@pytest.mark.parametrize(
    ("worker", "count", "share"),
    [
        ("gw0", "2", Share(0, 2)),
        ("gw1", "2", Share(1, 2)),
        (None, None, Share()),
        ("gw5", "2", Share()),
        ("x", "2", Share()),
    ],
)
def test_the_share_is_read_from_xdists_environment(monkeypatch, worker, count, share):
    for name, value in (("PYTEST_XDIST_WORKER", worker), ("PYTEST_XDIST_WORKER_COUNT", count)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert worker_share.worker_share() == share


def test_a_second_worker_takes_addresses_and_ports_the_first_never_does(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    ip = loopback_ip()
    assert int(ip.rsplit(".", 1)[1]) in Share(1, 2).of(LOOPBACK_OCTETS)
    port = server_process.free_port()
    assert port in Share(1, 2).of(range(server_process._FIRST_PORT, server_process._ephemeral_low()))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert int(loopback_ip().rsplit(".", 1)[1]) in Share(0, 2).of(LOOPBACK_OCTETS)
    assert int(loopback_ip(first=200).rsplit(".", 1)[1]) >= 200  # an explicit first address overrides the share
