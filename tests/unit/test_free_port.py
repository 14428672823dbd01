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


def test_the_span_a_test_worker_sets_holds_in_the_processes_it_starts(monkeypatch):
    """A parallel run's workers each pick ports from a span of their own; a `--workers` supervisor a test starts
    picks its workers' ports itself, and must keep to the span of the test worker that started it."""
    import subprocess
    import sys

    from pigeon.ops.local_ports import PORTS_BELOW

    monkeypatch.delenv(PORTS_BELOW, raising=False)  # (a parallel run's worker has set its own)
    top = ephemeral_low() - 8_000  # a span that overlaps the default one by half: 20 ports all in it say it held
    monkeypatch.setenv(PORTS_BELOW, str(top))
    out = subprocess.run([sys.executable, "-c", "from pigeon.ops.local_ports import free_port as f\n"
                          "print(*(f() for _ in range(20)))"], capture_output=True, text=True, check=True)
    ports = [int(p) for p in out.stdout.split()]
    assert len(ports) == 20 and all(max(1024, top - 16_384) <= p < top for p in ports), ports


def test_a_port_given_is_not_given_again_by_the_same_process(monkeypatch):
    """Ports are often picked for several servers before the first binds (a deployment's etcds and nodes): 500
    picks at random among 16,384 ports coincide ~7.6 times on average, unless a port given is remembered."""
    from pigeon.ops import local_ports

    monkeypatch.setattr(local_ports, "_given", {})
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports), sorted(p for p in ports if ports.count(p) > 1)


def test_a_port_chosen_elsewhere_is_not_given(monkeypatch):
    """A `--workers` supervisor is handed its shared port by whoever started it, and picks its workers' other
    ports before any of them binds that one: it must not pick it again."""
    from pigeon.ops import local_ports

    monkeypatch.setattr(local_ports, "_given", {})
    low = ephemeral_low()
    kept = set(range(max(1024, low - 16_384), low - 3_000))  # all but the span's top 3,000
    local_ports.taken(*kept)
    ports = [free_port() for _ in range(50)]
    assert not kept & set(ports), sorted(kept & set(ports))
