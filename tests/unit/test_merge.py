"""A StreamingPull of a spread topic merged from one stream to each owner of its shards (api.merge), against owners'
streams the test plays: a stream that ends retryably (its shards moved, its owner died) is replaced by streams to
the shards' owners now, and the client's stream goes on — its acks reach each shard's new owner, those sent while
the owner's stream was being replaced too; any other end, or a shard left without an owner, ends the client's."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest

from pigeon.api import merge
from pigeon.api.errors import Relayed
from pigeon.api.router import Owner, Part
from pigeon.core import limits
from pigeon.core.errors import Unavailable
from pigeon.core.pubsub_types import types

Req = types.StreamingPullRequest.pb()
SUB = "projects/p/subscriptions/s"


def ack(shard: int, offset: int = 1) -> str:
    return f"{SUB}.{offset << limits.shard_bits | shard}.1"


class OwnerStream:
    """One stream the merge opened to an owner: what it was asked (its head, then each request), and what the test
    has it send (a response, None to end, an exception to fail)."""

    def __init__(self, address: str, head: bytes):
        self.address, self.head = address, Req.FromString(head)
        self.asked: list = []
        self.out: asyncio.Queue = asyncio.Queue()

    def acks(self) -> list[str]:
        return [a for r in self.asked for a in r.ack_ids]


class Cluster:
    """The owners of a topic's four shards, as the router sees them; the streams the merge opened to them."""

    def __init__(self, shard_owners: dict[int, str | None]):
        self.shard_owners = shard_owners  # shard → address (None: here, "": no owner: moving)
        self.streams: list[OwnerStream] = []
        self.router = SimpleNamespace(cluster=SimpleNamespace(info=SimpleNamespace(dial="here:1"), gateways=None),
                                      engine=SimpleNamespace(closing=False), stream=self.stream,
                                      spread_settled=self.spread_settled)

    async def spread_settled(self, t):
        # as Router.spread_settled: while a shard has no owner it waits for one (here, a while of real time; a
        # fake that refused at once raced the test's own steps: the merge's reopen, 1 ms on, could come first)
        deadline = asyncio.get_running_loop().time() + 5.0
        while "" in self.shard_owners.values():
            if asyncio.get_running_loop().time() >= deadline:
                raise Unavailable("The topic's bundle is moving between nodes; retry.")
            await asyncio.sleep(0.002)
        groups: dict = {}
        for k, a in self.shard_owners.items():
            groups.setdefault(a, []).append(k)
        return [Part(None if a is None else Owner(a, tuple(ks)), tuple(ks)) for a, ks in groups.items()]

    async def stream(self, owner, method, first, requests, context, watch=True):
        s = OwnerStream(owner.address, first)
        self.streams.append(s)

        async def read():
            async for r in requests:
                s.asked.append(r)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await s.out.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            reader.cancel()

    def here(self, first, requests):
        """This node's share (grpc_api's `own_share`), played as a stream to "here:1"."""
        return self.stream(Owner("here:1", ()), None, first.SerializeToString(), requests, None)

    def open_at(self, address: str) -> list[OwnerStream]:
        return [s for s in self.streams if s.address == address]


async def _settle():
    for _ in range(20):
        await asyncio.sleep(0)


async def _until(check, timeout: float = 10.0):
    # (real time: 2 s ran out once with the machine's two cores busy with other runs; a pass costs what it costs)
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _merged(cluster: Cluster, client: asyncio.Queue, first=None):
    async def requests():
        while (r := await client.get()) is not None:
            yield r

    first = first or Req(subscription=SUB, max_outstanding_messages=30, stream_ack_deadline_seconds=10)
    return merge.streaming_pull(cluster.router, SimpleNamespace(name="projects/p/topics/t"), first, requests(), None,
                                cluster.here)


def _from_one_owner():
    """A merge whose topic's shards are all one owner's, and its first response to come."""
    cluster = Cluster({k: "n2:1" for k in range(4)})
    return cluster, asyncio.ensure_future(_merged(cluster, asyncio.Queue()).__anext__())


@pytest.fixture(autouse=True)
def quick_reopen(monkeypatch):
    monkeypatch.setattr(limits, "merge_reopen_s", 0.001)


def test_a_stream_whose_shards_moved_is_replaced_and_the_clients_stream_goes_on():
    async def run():
        cluster = Cluster({0: None, 1: "n2:1", 2: "n2:1", 3: "n3:1"})
        client: asyncio.Queue = asyncio.Queue()
        merged = _merged(cluster, client)
        got: list[bytes] = []

        async def consume():
            async for resp in merged:
                got.append(resp)

        consumer = asyncio.ensure_future(consume())
        await _until(lambda: len(cluster.streams) == 3)
        assert sorted(s.head.max_outstanding_messages for s in cluster.streams) == [10, 10, 10]
        (n3,) = cluster.open_at("n3:1")
        n3.out.put_nowait(b"from n3")
        await _until(lambda: got == [b"from n3"])

        # n3 dies: its shard moves to n2, whose stream is open already — nothing new is opened, and an ack of shard
        # 3 sent while n3's stream is being replaced reaches n2
        cluster.shard_owners[3] = ""
        n3.out.put_nowait(Relayed(grpc.StatusCode.UNAVAILABLE, "The node that owns this topic cannot be reached."))
        await _settle()
        client.put_nowait(Req(ack_ids=[ack(3)]))
        await _settle()
        cluster.shard_owners[3] = "n2:1"
        (n2,) = cluster.open_at("n2:1")
        await _until(lambda: ack(3) in n2.acks())
        assert len(cluster.streams) == 3 and not consumer.done()
        client.put_nowait(Req(ack_ids=[ack(0), ack(3, 2), ack(1)]))
        (here,) = cluster.open_at("here:1")
        await _until(lambda: ack(3, 2) in n2.acks() and ack(0) in here.acks())
        assert ack(1) in n2.acks() and ack(3, 2) not in here.acks()

        # shard 1 moves from n2 to n4: n2's stream is cut (its logs moved), both owners get one
        cluster.shard_owners[1] = "n4:1"
        n2.out.put_nowait(Unavailable("The topic's bundle moved to another node; retry."))
        await _until(lambda: len(cluster.open_at("n2:1")) == 2 and len(cluster.open_at("n4:1")) == 1)
        n4 = cluster.open_at("n4:1")[0]
        assert n4.head.subscription == SUB and n4.head.stream_ack_deadline_seconds == 10
        assert not n4.head.ack_ids and n4.head.max_outstanding_messages > 0
        n4.out.put_nowait(b"from n4")
        await _until(lambda: got[-1] == b"from n4")
        client.put_nowait(Req(modify_deadline_ack_ids=[ack(1), ack(2)], modify_deadline_seconds=[0, 30]))
        n2 = cluster.open_at("n2:1")[1]
        await _until(lambda: any(r.modify_deadline_ack_ids for r in n4.asked) and
                     any(r.modify_deadline_ack_ids for r in n2.asked))
        assert [list(r.modify_deadline_ack_ids) for r in n4.asked if r.modify_deadline_ack_ids] == [[ack(1)]]
        assert not consumer.done()
        consumer.cancel()

    asyncio.run(run())


def test_acks_a_stream_took_just_before_it_ended_go_to_the_shards_new_owner_too(monkeypatch):
    """An owner handing a shard over refuses its acks by ending the stream: what it took lately may not be applied,
    and goes again to the shard's new owner; what it took long before is not sent again."""
    async def run():
        cluster = Cluster({0: "n2:1", 1: "n2:1", 2: "n3:1", 3: "n3:1"})
        client: asyncio.Queue = asyncio.Queue()
        consumer = asyncio.ensure_future(_merged(cluster, client).__anext__())
        await _until(lambda: len(cluster.streams) == 2)
        (n3,) = cluster.open_at("n3:1")
        monkeypatch.setattr(limits, "merge_resend_s", 0.2)
        client.put_nowait(Req(ack_ids=[ack(3, 5)]))
        await _until(lambda: ack(3, 5) in n3.acks())
        await asyncio.sleep(0.3)  # (out of the window)
        client.put_nowait(Req(ack_ids=[ack(2)], modify_deadline_ack_ids=[ack(3)], modify_deadline_seconds=[0]))
        await _until(lambda: ack(2) in n3.acks())
        cluster.shard_owners.update({2: "n2:1", 3: "n2:1"})
        n3.out.put_nowait(Unavailable("A shard of the topic is moving to another node; retry."))
        (n2,) = cluster.open_at("n2:1")
        await _until(lambda: ack(2) in n2.acks() and any(r.modify_deadline_ack_ids for r in n2.asked))
        assert [list(r.modify_deadline_ack_ids) for r in n2.asked if r.modify_deadline_ack_ids] == [[ack(3)]]
        assert ack(3, 5) not in n2.acks()
        assert not consumer.done()
        consumer.cancel()

    asyncio.run(run())


def test_a_stream_ended_for_good_ends_the_clients_stream_with_its_status():
    async def run():
        cluster = Cluster({0: "n2:1", 1: "n2:1", 2: "n3:1", 3: "n3:1"})
        merged = _merged(cluster, asyncio.Queue())
        got = asyncio.ensure_future(merged.__anext__())
        await _until(lambda: len(cluster.streams) == 2)
        cluster.open_at("n3:1")[0].out.put_nowait(Relayed(grpc.StatusCode.NOT_FOUND, "Resource not found."))
        with pytest.raises(Relayed) as e:
            await got
        assert e.value.code == grpc.StatusCode.NOT_FOUND

    asyncio.run(run())


def test_a_stream_ended_with_a_status_the_clients_reopen_on_is_replaced():
    """gRPC's own INTERNAL ("Internal error from Core"), when the connection to an owner killed -9 broke under a
    write, ended the client's stream through another node; the client libraries reopen a stream on it, and so does
    the merge for its part."""
    async def run():
        cluster = Cluster({0: "n2:1", 1: "n2:1", 2: "n3:1", 3: "n3:1"})
        merged = _merged(cluster, asyncio.Queue())
        got = asyncio.ensure_future(merged.__anext__())
        await _until(lambda: len(cluster.streams) == 2)
        cluster.open_at("n3:1")[0].out.put_nowait(Relayed(grpc.StatusCode.INTERNAL, "Internal error from Core"))
        await _until(lambda: len(cluster.open_at("n3:1")) == 2)
        cluster.open_at("n3:1")[1].out.put_nowait(b"from n3 again")
        assert await got == b"from n3 again"

    asyncio.run(run())


def test_a_shard_left_without_an_owner_ends_the_clients_stream_unavailable():
    async def run():
        cluster = Cluster({0: "n2:1", 1: "n2:1", 2: "n3:1", 3: "n3:1"})

        async def never_settled(t):
            raise Unavailable("The topic's bundle is moving between nodes; retry.")

        merged = _merged(cluster, asyncio.Queue())
        got = asyncio.ensure_future(merged.__anext__())
        await _until(lambda: len(cluster.streams) == 2)
        cluster.router.spread_settled = never_settled
        cluster.open_at("n3:1")[0].out.put_nowait(None)  # (its owner ended it: shutting down)
        with pytest.raises(Unavailable):
            await got
        assert len(cluster.streams) == 2

    asyncio.run(run())


def test_replacements_that_follow_each_other_back_off(monkeypatch, caplog):
    """An owner that ends every stream at once is not asked again in a tight loop: the waits double, up to the
    most."""
    monkeypatch.setattr(limits, "merge_reopen_s", 0.01)
    monkeypatch.setattr(limits, "merge_reopen_s_max", 0.04)

    async def run():
        cluster, consumer = _from_one_owner()
        for n in range(1, 6):
            await _until(lambda: len(cluster.streams) == n)
            cluster.streams[-1].out.put_nowait(None)
        await _until(lambda: len(cluster.streams) == 6)
        consumer.cancel()

    caplog.set_level("INFO", logger="pigeon.router")
    asyncio.run(run())
    waits = [r.args[-1] for r in caplog.records if "opened again where its shards are now" in r.getMessage()]
    assert waits == [0.01, 0.02, 0.04, 0.04, 0.04]


def test_a_forwarded_stream_follows_its_bundle_to_its_next_owner(monkeypatch):
    """A topic in one bundle that another node owns: the stream forwarded there is replaced by one to the bundle's
    next owner — this node's own port when this node took it over — and the client's acks follow; once a shard of
    the topic is handed to another bundle, by one to each shard's owner."""
    monkeypatch.setattr(limits, "merge_resend_s", 0.0)  # (acks sent again: the test before)

    async def run():
        cluster = Cluster({})
        owner = ["n2:1"]

        async def for_stream(name, context):
            assert name == SUB
            return None if owner[0] is None else Owner(owner[0], (7,))

        async def spread_subscription(name, context):
            return None if not handed[0] else SimpleNamespace(name="projects/p/topics/t")

        handed = [False]
        cluster.router.for_stream = for_stream
        cluster.router.spread_subscription = spread_subscription
        client: asyncio.Queue = asyncio.Queue()

        async def requests():
            while (r := await client.get()) is not None:
                yield r

        first = Req(subscription=SUB, max_outstanding_messages=30, ack_ids=[ack(2)])
        merged = merge.forwarded(cluster.router, Owner("n2:1", (7,)), first, requests(), None, cluster.here)
        got = asyncio.ensure_future(merged.__anext__())
        await _until(lambda: len(cluster.streams) == 1)
        (n2,) = cluster.streams
        assert n2.head.max_outstanding_messages == 30 and not n2.head.ack_ids
        await _until(lambda: n2.acks() == [ack(2)])
        owner[0] = None  # (this node took the bundle over)
        n2.out.put_nowait(Unavailable("The topic's bundle moved to another node; retry."))
        await _until(lambda: len(cluster.streams) == 2)
        here = cluster.streams[1]
        assert here.address == "here:1" and here.head.max_outstanding_messages == 30
        client.put_nowait(Req(ack_ids=[ack(5)]))
        await _until(lambda: here.acks() == [ack(5)])
        here.out.put_nowait(b"from here")
        assert await got == b"from here"

        # a shard of the topic handed to n3's bundle: the stream here is ended, one to each shard's owner opened
        handed[0] = True
        cluster.shard_owners.update({0: None, 1: None, 2: "n3:1", 3: None})
        here.out.put_nowait(Unavailable("A shard of the topic moved to another node; reconnect."))
        await _until(lambda: len(cluster.streams) == 4)
        assert sorted(s.address for s in cluster.streams[2:]) == ["here:1", "n3:1"]
        client.put_nowait(Req(ack_ids=[ack(2), ack(1)]))
        (n3,), here = cluster.open_at("n3:1"), cluster.open_at("here:1")[-1]
        await _until(lambda: n3.acks() == [ack(2)] and here.acks() == [ack(1)])

    asyncio.run(run())


def test_a_merged_streams_flow_control_follows_the_owners_that_deliver():
    demand_shares = merge.demand_shares

    assert demand_shares(1000, 3, set()) == demand_shares(1000, 3, {0, 1, 2}) == [333, 333, 333]
    assert demand_shares(1000, 3, {1}) == [41, 918, 41]  # the silent keep an eighth of an even share
    assert demand_shares(1000, 4, {0, 3}) == [469, 31, 31, 469]
    for limit in (1, 7, 100, 1000, 10 << 20):
        for busy in (set(), {0}, {0, 2}, {0, 1, 2, 3}):
            shares = demand_shares(limit, 4, busy)
            assert min(shares) >= 1 and (sum(shares) <= limit or limit < 8)
    assert demand_shares(0, 3, {0}) == [0, 0, 0]  # no limit stays none


def test_a_handoff_passes_on_the_requests_read_before_the_stream_followed_first():
    async def run():
        handoff = merge.Handoff()
        handoff.put(Req(ack_ids=[ack(1)]))  # (read after the stream here broke, before it followed)
        requests = handoff.requests()
        handoff.put(Req(ack_ids=[ack(2)]))
        handoff.put(None)  # the client half-closed
        return [list(r.ack_ids) async for r in requests]

    assert asyncio.run(run()) == [[ack(1)], [ack(2)]]


def test_an_owner_that_delivered_up_to_its_share_keeps_being_steered_more_when_the_turn_comes_late(monkeypatch):
    """Every message in one owner's shards: its stream delivers its even share, then stands still — held back by
    flow control, not out of messages. A steering turn that comes after that (a busy machine: later than two turns'
    time) still counts it as delivering, and gives it nearly all of the client's flow control."""
    monkeypatch.setattr(limits, "merge_steer_s", 0.02)

    async def run():
        cluster = Cluster({0: "n2:1", 1: "n2:1", 2: "n3:1", 3: "n4:1"})
        merged = _merged(cluster, asyncio.Queue())
        got = asyncio.ensure_future(merged.__anext__())
        await _until(lambda: len(cluster.streams) == 3)
        (n2,) = cluster.open_at("n2:1")
        assert n2.head.max_outstanding_messages == 10
        n2.out.put_nowait(b"its first ten")
        assert await got == b"its first ten"
        time.sleep(3 * limits.merge_steer_s)  # (the loop held up: the next turn comes late)
        await _until(lambda: any(r.max_outstanding_messages >= 24 for r in n2.asked))
        n2.out.put_nowait(b"eighteen more")
        assert await merged.__anext__() == b"eighteen more"
        await asyncio.sleep(10 * limits.merge_steer_s)  # (nothing more from it: it holds its share)
        shares = [r.max_outstanding_messages for r in n2.asked if r.max_outstanding_messages]
        assert shares[-1] >= 24, shares

    asyncio.run(run())


def test_a_turn_of_the_steering_while_the_only_stream_is_replaced_changes_nothing(monkeypatch):
    """The flow control is steered every limits.merge_steer_s, also while the merge has no stream open (its only
    one ended and waits to be replaced): nothing to steer then, and the client's stream goes on."""
    monkeypatch.setattr(limits, "merge_reopen_s", 0.05)
    monkeypatch.setattr(limits, "merge_steer_s", 0.005)

    async def run():
        cluster, got = _from_one_owner()
        await _until(lambda: len(cluster.streams) == 1)
        cluster.streams[0].out.put_nowait(None)
        await _until(lambda: len(cluster.streams) == 2)
        assert not got.done(), got
        cluster.streams[1].out.put_nowait(b"after")
        assert await got == b"after"

    asyncio.run(run())
