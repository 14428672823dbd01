"""Pigeon: a durable publish/subscribe and task-queue server speaking the Pub/Sub v1 API."""

import os as _os

from pigeon.version import __version__  # noqa: F401 — its one source


def _grpc_on_posix_io() -> None:
    """gRPC (grpcio 1.85) moves a server's bytes either through its EventEngine (its default) or through its older
    POSIX I/O; on the latter a unary call from a Python client reaches a Python server's handler ~80 µs sooner (of
    a ~0.5 ms round trip: `python scripts/grpc_floor.py`, docs/latency.md). gRPC reads the choice from
    GRPC_EXPERIMENTS once, when it is imported: so every Pigeon process imports it here, asking for the POSIX
    listener unless the variable already names it, and then puts the variable back as it was — the processes it
    starts choose for themselves. Clients keep the EventEngine: on POSIX I/O a client's first call after its
    server was killed and restarted on the same port failed now and then ("Stream removed", UNAVAILABLE)."""
    before = _os.environ.get("GRPC_EXPERIMENTS")
    if before and "event_engine_listener" in before:
        return
    _os.environ["GRPC_EXPERIMENTS"] = ",".join(filter(None, (before, "-event_engine_listener")))
    try:
        import grpc  # noqa: F401 — read now
    finally:
        if before is None:
            del _os.environ["GRPC_EXPERIMENTS"]
        else:
            _os.environ["GRPC_EXPERIMENTS"] = before


_grpc_on_posix_io()
