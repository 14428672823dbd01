"""A forwarded call that does not wait by design (a publish, an ack) ends UNAVAILABLE as soon as the routes name
another owner of its bundle: an owner paused (SIGSTOP) or cut off past its session neither answers nor refuses,
and the call would wait out its deadline while the bundle is served elsewhere — in a round of faults, probes sent to
a survivor just before it took a paused owner's bundles over waited their whole 2 s deadline. Cut, the client's
retry finds the new owner."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.api.router import Owner, Router
from pigeon.core.errors import Unavailable


class _Cluster:
    def __init__(self):
        self.routes = {3: "10.0.0.1:1", 4: "10.0.0.2:1"}  # log → its owner's address
        self.changed = asyncio.Event()

    def routes_changed(self):
        return self.changed

    def address_of(self, log_id):
        return self.routes.get(log_id)

    def move(self, log_id, address):
        self.routes[log_id] = address
        ev, self.changed = self.changed, asyncio.Event()
        ev.set()


class _Pending:
    """A forwarded call to an owner that answers nothing until it is cancelled (or answers)."""

    def __init__(self):
        self.fut = asyncio.get_running_loop().create_future()

    def __await__(self):
        return self.fut.__await__()

    def cancel(self):
        self.fut.cancel()


def test_a_forwarded_call_ends_unavailable_once_its_owner_lost_the_bundle():
    async def go():
        cluster = _Cluster()
        router = Router(engine=None, cluster=cluster)
        paused, other = _Pending(), _Pending()
        to_paused = asyncio.create_task(router._unless_moved(Owner("10.0.0.1:1", (3,)), paused))
        to_other = asyncio.create_task(router._unless_moved(Owner("10.0.0.2:1", (4,)), other))
        await asyncio.sleep(0.01)
        assert not to_paused.done()
        cluster.move(3, "10.0.0.3:1")  # the paused owner's session ended: another node took log 3 over
        with pytest.raises(Unavailable, match="moved"):
            await asyncio.wait_for(to_paused, 1)
        await asyncio.sleep(0.01)
        assert not to_other.done()  # its owner did not move
        other.fut.set_result(b"answer")
        assert await to_other == b"answer"
        waiting = asyncio.create_task(router._unless_moved(Owner("10.0.0.2:1", (4,)), _Pending()))
        await asyncio.sleep(0.01)
        waiting.cancel()  # the caller's own cancellation stays one
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await router.close()

    asyncio.run(go())
