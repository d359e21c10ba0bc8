"""The ports tests give their child processes (testing/server_process.free_port): outside the kernel's ephemeral
range, from which any outgoing connection may take a port between the test's check and the child's bind."""

from __future__ import annotations

import socket

from pagedinfer.testing import server_process
from pagedinfer.testing.server_process import free_port


def test_ports_are_below_the_ephemeral_range_bindable_and_never_handed_out_twice():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(server_process._FIRST_PORT <= p < server_process._ephemeral_low() for p in ports)
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when handed out


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with socket.socket() as probe:  # a port free now (busy + 1 was, on a loaded machine, often another's)
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        draws = iter([busy, free])
        monkeypatch.setattr(server_process, "_FIRST_PORT", 1024)
        monkeypatch.setattr(server_process, "_ephemeral_low", lambda: 65536)
        monkeypatch.setattr(server_process.random, "randrange", lambda a, b: next(draws))
        assert free_port() == free  # busy passed over
