"""A forwarded call that waits by design (StreamingPull, Pull) ends UNAVAILABLE as soon as its node shuts down:
left open, gRPC would cancel it at the end of the grace period, and a CANCELLED StreamingPull is final to the
client libraries."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.api.router import Owner, Router
from pigeon.core.errors import Unavailable
from pigeon.node.engine import SHUTTING_DOWN


class _Cluster:
    def __init__(self):
        self.changed = asyncio.Event()

    def routes_changed(self):
        return self.changed

    def address_of(self, log_id):
        return "127.0.0.1:1"  # the owner never moves here


class _Call:
    """A forwarded call that would wait forever but for a cancel."""

    def __init__(self):
        self.done = asyncio.get_running_loop().create_future()
        self.cancelled = False

    def cancel(self):
        self.cancelled = True
        self.done.cancel()


def test_end_waiting_ends_every_open_forwarded_wait_with_unavailable():
    async def go():
        router = Router(engine=None, cluster=_Cluster())
        calls = [_Call(), _Call()]

        async def forwarded(call):
            async with router._cut_when_moved(Owner("127.0.0.1:1", 3), call):
                await call.done

        tasks = [asyncio.create_task(forwarded(c)) for c in calls]
        await asyncio.sleep(0)
        assert len(router._waiting) == 2 and not any(c.cancelled for c in calls)
        router.end_waiting()
        for t in tasks:
            with pytest.raises(Unavailable, match=SHUTTING_DOWN):
                await t
        assert all(c.cancelled for c in calls) and not router._waiting

    asyncio.run(go())
