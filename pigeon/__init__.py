"""Pigeon: a durable publish/subscribe and task-queue server speaking the Pub/Sub v1 API."""

import os as _os

__version__ = "0.1.0"


def _grpc_on_posix_io() -> None:
    """gRPC (grpcio 1.85) moves a call's bytes either through its EventEngine (its default) or through its older
    POSIX I/O; on the latter one unary call from a Python client to a Python server takes ~100 µs less of ~0.5 ms
    (`python scripts/grpc_floor.py`, `docs/latency.md`). gRPC reads the choice from GRPC_EXPERIMENTS once, when
    it is imported: so every Pigeon process imports it here, asking for POSIX I/O unless the variable already
    names these experiments, and then puts the variable back as it was — the processes it starts choose for
    themselves."""
    before = _os.environ.get("GRPC_EXPERIMENTS")
    if before and ("event_engine_listener" in before or "event_engine_client" in before):
        return
    _os.environ["GRPC_EXPERIMENTS"] = ",".join(filter(None, (before, "-event_engine_listener",
                                                             "-event_engine_client")))
    try:
        import grpc  # noqa: F401 — read now
    finally:
        if before is None:
            del _os.environ["GRPC_EXPERIMENTS"]
        else:
            _os.environ["GRPC_EXPERIMENTS"] = before


_grpc_on_posix_io()
