"""One `pigeon serve` and its official clients shared by a test module (its tests make resources of their own
names, so they need no server each)."""

from __future__ import annotations

import contextlib

import pytest
from google.cloud import pubsub_v1

from pigeon.testing.server import ServerProcess


@contextlib.contextmanager
def module_clients(data_dir: str):
    """(publisher, subscriber) pointed through PUBSUB_EMULATOR_HOST at a server on `data_dir`, killed after."""
    srv = ServerProcess(data_dir, fsync="never").start()
    mp = pytest.MonkeyPatch()
    mp.setenv("PUBSUB_EMULATOR_HOST", srv.address)
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    try:
        yield pub, sub
    finally:
        sub.close()
        pub.stop()
        mp.undo()
        srv.kill()
