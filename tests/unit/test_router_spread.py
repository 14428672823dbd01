"""Calls about a topic spread over the nodes while one of its shards moves between them (api.router, api.spread):
a keyless publish goes to a shard that has an owner, a keyed one is refused only when its key's shard is the one
moving, an ack only when it names that shard, a Pull takes from the others; a call that needs every shard still
waits for the move (UNAVAILABLE)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pigeon.api.router import Router
from pigeon.broker import commands
from pigeon.broker.resources import Topic
from pigeon.broker.state import BrokerState
from pigeon.core.errors import Unavailable

BUNDLES = 16
NAME = "projects/p/topics/spread"


def _router(here: set[int], owners: dict[int, str | None]):
    """A node owning the logs of the shards in `here`; another shard's log owned at owners[k] (None: nobody's now,
    as while its bundle moves)."""
    state = BrokerState()
    state.apply(commands.create_topic(state, Topic(name=NAME), 4, spread=True))
    t = state.topics[NAME]
    shard_of = {log: k for k, log in enumerate(state.shard_logs(t, BUNDLES))}
    assert len(shard_of) == 4, "each shard in a bundle of its own"
    engine = SimpleNamespace(state=state, region=None, config=SimpleNamespace(bundles=BUNDLES),
                             owns=lambda log: shard_of.get(log) in here, check_open=lambda: None)
    cluster = SimpleNamespace(gateways=None, info=SimpleNamespace(dial="here:1"),
                              address_of=lambda log: owners.get(shard_of.get(log)))
    return Router(engine, cluster), t


def _key_of(t, shard: int) -> str:
    return next(k for k in (f"key-{i}" for i in range(1000)) if t.shard_for(k) == shard)


def test_a_keyless_publish_is_stored_here_while_another_shard_moves():
    router, t = _router(here={0}, owners={1: "n2:1", 2: None, 3: "n3:1"})
    assert all(router.publish_owner(t, "") is None for _ in range(8))
    with pytest.raises(Unavailable):  # a call about every shard waits for the move
        router.spread(t)


def test_a_keyless_publish_goes_to_the_shards_that_have_an_owner():
    router, t = _router(here=set(), owners={0: "n2:1", 1: None, 2: "n3:1", 3: "n2:1"})
    owners = {router.publish_owner(t, "").address for _ in range(8)}
    assert owners == {"n2:1", "n3:1"}
    router, t = _router(here=set(), owners={0: None, 1: None, 2: None, 3: None})
    with pytest.raises(Unavailable):
        router.publish_owner(t, "")


def test_a_keyed_publish_waits_only_for_its_own_shard():
    router, t = _router(here={0}, owners={1: None, 2: "n3:1", 3: "n2:1"})
    with pytest.raises(Unavailable):
        router.publish_owner(t, _key_of(t, 1))
    assert router.publish_owner(t, _key_of(t, 2)).address == "n3:1"
    assert router.publish_owner(t, _key_of(t, 0)) is None
    with pytest.raises(Unavailable):
        router.shard_owner(t, 1)
    assert router.shard_owner(t, 3).address == "n2:1" and router.shard_owner(t, 0) is None


def test_acks_wait_only_for_the_shard_they_name():
    """An Acknowledge split by shard (api.spread.split_acks) is refused while a shard it names moves (an ack
    answered OK must be durable at that shard's owner), and taken while only another shard moves."""
    import asyncio

    from google.pubsub_v1.types import AcknowledgeRequest

    from pigeon.api import spread

    router, t = _router(here={0, 2, 3}, owners={1: None})
    ack = {k: f"sub.{k}.1" for k in range(4)}  # ("sub.num.version": a message number names its shard)
    assert all(spread.shard_of(a) == k for k, a in ack.items())
    taken = []

    async def here(ids):
        taken.extend(ids)
        return b""

    async def run(ids):
        req = AcknowledgeRequest.pb()(subscription="projects/p/subscriptions/s", ack_ids=ids)
        return await spread.split_acks(router, t, req, ids, "/google.pubsub.v1.Subscriber/Acknowledge", None, here)

    asyncio.run(run([ack[0], ack[3]]))
    assert taken == [ack[0], ack[3]]
    with pytest.raises(Unavailable):
        asyncio.run(run([ack[2], ack[1]]))
    assert taken == [ack[0], ack[3]], "nothing of a refused call is taken"


def test_a_pull_takes_from_the_shards_that_have_an_owner():
    import asyncio

    from google.pubsub_v1.types import PullRequest

    from pigeon.api import spread

    asked = []

    async def here(n, immediately):
        asked.append(n)
        return b"got"

    req = PullRequest.pb()(subscription="projects/p/subscriptions/s", max_messages=10, return_immediately=True)
    router, t = _router(here={0, 2, 3}, owners={1: None})
    assert asyncio.run(spread.pull(router, t, req, None, here)) == b"got" and asked == [10]
    router, t = _router(here=set(), owners={})
    with pytest.raises(Unavailable):
        asyncio.run(spread.pull(router, t, req, None, here))


def test_a_streaming_pull_waits_for_a_moving_shards_new_owner(monkeypatch):
    """A StreamingPull holds one stream to each owner for its life: opened while a shard moves, it waits for the
    shard's new owner (router.spread_settled) rather than answer UNAVAILABLE, which spends one of the client's few
    reopens — and still answers UNAVAILABLE once limits.forward_s_max passed."""
    import asyncio

    from pigeon.core import limits

    owners = {1: None, 2: "n2:1", 3: "n2:1"}
    router, t = _router(here={0}, owners=owners)
    changed = asyncio.Event()
    router.cluster.routes_changed = lambda: changed
    router.engine.closing = False

    async def move_done():
        await asyncio.sleep(0.2)
        owners[1] = "n3:1"
        changed.set()

    async def run():
        mover = asyncio.ensure_future(move_done())
        parts = await asyncio.wait_for(router.spread_settled(t), 5)
        await mover
        return {k: (p.owner.address if p.owner else None) for p in parts for k in p.shards}

    assert asyncio.run(run()) == {0: None, 1: "n3:1", 2: "n2:1", 3: "n2:1"}
    owners[1] = None
    monkeypatch.setattr(limits, "forward_s_max", 0.3)
    with pytest.raises(Unavailable):
        asyncio.run(router.spread_settled(t))


def test_a_refusal_that_lasts_names_itself_in_the_log(monkeypatch, caplog):
    """A move refuses calls for a fraction of a second; refused longer than limits.refusal_log_s, the node says
    which log and why (once a while), and a later spell starts its count again."""
    import asyncio
    import logging

    from pigeon.core import limits

    monkeypatch.setattr(limits, "refusal_log_s", 0.2)
    router, t = _router(here={0}, owners={1: None, 2: "n2:1", 3: "n2:1"})

    async def refuse(seconds: float):
        end = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < end:
            with pytest.raises(Unavailable):
                router.spread(t)
            await asyncio.sleep(0.02)

    async def run():
        with caplog.at_level(logging.WARNING, logger="pigeon.router"):
            await refuse(0.1)
            assert not caplog.records
            await refuse(0.3)
            assert len(caplog.records) == 1 and "has no owner" in caplog.records[0].getMessage()
            await asyncio.sleep(1.1)  # the spell ends; the next one is counted from its own start
            await refuse(0.1)
            assert len(caplog.records) == 1

    asyncio.run(run())
