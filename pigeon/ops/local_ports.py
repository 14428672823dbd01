"""Loopback servers this machine starts itself (the workers' etcd and peer ports; benchmarks and tests): a free
port to listen on, and where etcd is installed."""

from __future__ import annotations

import os
import random
import shutil
import socket
import time


PORTS_BELOW = "PIGEON_PORTS_BELOW"  # where free_port's span ends, when set: a test run's parallel workers each give
#                                   theirs to the servers they start, whose own free_port (a supervisor's workers'
#                                   ports) then keeps to it too


def ephemeral_low() -> int:
    below = os.environ.get(PORTS_BELOW)
    if below:
        return int(below)
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


GIVEN_HELD_S = 600.0  # a port free_port gave is not given again by this process for this long
_given: dict[int, float] = {}  # port → when free_port gave it


def free_port() -> int:
    """A loopback port nobody listens on, for a server to start on — chosen below the ephemeral range. A port
    the kernel hands out (bind to 0) is one it may also hand to a client's outgoing connection before the server
    binds it, or while a killed server restarts on it; below the range only servers take ports. Nor one this
    process gave in the last GIVEN_HELD_S: ports are often picked for several servers before the first of them
    binds (a deployment's etcds and nodes), and two picks at random among 16,384 ports coincided in about one
    deployment of 300 — a server then found its port taken by another of its deployment."""
    low = ephemeral_low()
    rng = random.SystemRandom()
    now = time.monotonic()
    if len(_given) > 1024:
        for port in [p for p, at in _given.items() if now - at > GIVEN_HELD_S]:
            del _given[port]
    for _ in range(200):
        port = rng.randrange(max(1024, low - 16384), low)
        if now - _given.get(port, -GIVEN_HELD_S) < GIVEN_HELD_S:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _given[port] = now
            return port
    raise RuntimeError(f"no free loopback port below {low}")


def taken(*ports: int) -> None:
    """Ports chosen elsewhere for servers about to start (a supervisor's `--port` and `--http-port`, picked by
    whoever started it): free_port gives none of them while they are not bound yet."""
    now = time.monotonic()
    for port in ports:
        if port:
            _given[port] = now


def etcd_binary() -> str | None:
    """The etcd executable (Debian's etcd-server puts it in /usr/bin), or None when it is not installed."""
    return shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
