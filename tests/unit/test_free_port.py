"""Servers under test start on ports below the kernel's ephemeral range: a port from `bind(("", 0))` can be
handed to a client's outgoing connection before the server binds it, or while a killed server restarts on it
(the e2e restart tests reuse the port), and the server then fails with "address in use"."""

from pigeon.ops.local_ports import ephemeral_low
from pigeon.testing.server import free_port


def test_a_servers_port_is_below_the_ephemeral_range_and_free():
    low = ephemeral_low()
    ports = {free_port() for _ in range(50)}
    assert all(1024 <= p < low for p in ports)
    assert len(ports) > 1  # chosen at random: concurrent test runs rarely pick the same one
