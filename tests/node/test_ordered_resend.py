"""An ordered subscription under a client that behaves as the official one: the real engine, one StreamingPull
stream, and a client model with Pub/Sub's ordering rules on its side (one message of a key in its callback at a
time, the rest on hold in arrival order) whose callback refuses each message n % 7 == 3 once; acks and nacks are
sent in separate requests, split and delayed at random, and the publisher's batches come apart at random, over
random flow control. In the first test no lease ever runs out (the clock stands still), so everything that
happens is the dispatch's own doing; in the second the clock jumps past the ack deadline now and then.

What must hold for every key, as the official client's end-to-end test checks it
(tests/e2e/test_ordering_dlq_filters.py): the callbacks see the key in runs of consecutive numbers; the first run
starts at 0; every later run starts at a refused message (or, where leases ran out, any message) at or below where
the run before it ended (a resend repeats every later message of the key, acked or not); the last run ends at the
key's last message. A full run of
that test once ended key `beta` at 28 after 29: a resend cut short by flow control left 29 waiting, the first
delivery's ack of it came in meanwhile, the ack floor passed it, and the resend skipped it."""

from __future__ import annotations

import asyncio
import collections
import random

import pytest
from google.pubsub_v1 import types

from pigeon.node.engine import Engine
from pigeon.ops.config import Config
from pigeon.testing.clock import SimClock
from pigeon.testing.ordering import key_runs

T, S = "projects/p/topics/ordered", "projects/p/subscriptions/ordered"
_Topic, _Sub, _Req, _Msg, _Resp = (getattr(types, n).pb() for n in
                                   ("Topic", "Subscription", "PublishRequest", "PubsubMessage", "PullResponse"))
KEYS, N = ("alpha", "beta", "gamma"), 30


class Client:
    """The official client's ordering, as google-cloud-pubsub's MessagesOnHold keeps it."""

    def __init__(self):
        self.on_hold: collections.deque = collections.deque()
        self.busy: dict[str, collections.deque] = {}  # key → its messages waiting behind the one in a callback
        self.ready: list = []  # messages whose callback may run now (one per key)
        self.acks: list[str] = []
        self.nacks: list[str] = []
        self.seen: dict[str, list[int]] = collections.defaultdict(list)
        self.refused: set[bytes] = set()

    def receive(self, messages) -> None:
        self.on_hold.extend(messages)
        while self.on_hold:
            m = self.on_hold.popleft()
            key = m.message.ordering_key
            if key in self.busy:
                self.busy[key].append(m)
            else:
                self.busy[key] = collections.deque()
                self.ready.append(m)

    def callback(self, m) -> None:
        key, n = m.message.data.decode().rsplit("-", 1)
        self.seen[key].append(int(n))
        if int(n) % 7 == 3 and m.message.data not in self.refused:
            self.refused.add(m.message.data)
            self.nacks.append(m.ack_id)
        else:
            self.acks.append(m.ack_id)
        waiting = self.busy[key]
        if waiting:
            self.ready.append(waiting.popleft())
        else:
            del self.busy[key]

    def idle(self) -> bool:
        return not (self.on_hold or self.ready or self.acks or self.nacks)


async def _scenario(seed: int, shards: int, tmp_path, expire: bool = False) -> None:
    r = random.Random(seed)
    clock = SimClock()
    e = Engine(Config(data_dir=str(tmp_path / f"d{seed}-{shards}"), fsync="never", shards_per_topic=shards), clock)
    await e.start()
    e._maintenance.cancel()
    await e.create_topic(_Topic(name=T))
    await e.create_subscription(_Sub(name=S, topic=T, ack_deadline_seconds=10, enable_message_ordering=True))
    outstanding = r.choice([1000, 7, 3, 1])
    stream = e.delivery.open_stream(S, "c", 10, outstanding, 0)
    inbox: collections.deque = collections.deque()

    async def serve():
        while (out := await e.delivery.stream_next(stream)) is not None:
            if out:
                inbox.append(_Resp.FromString(b"".join(out)).received_messages)

    server = asyncio.create_task(serve())
    per_key = {}
    for k in KEYS:  # each key's batches in order, the keys interleaved
        sizes, i = [], 0
        while i < N:
            sizes.append(min(N - i, r.choice([1, 2, 5, 10, 30])))
            i += sizes[-1]
        per_key[k] = collections.deque((k, range(sum(sizes[:j]), sum(sizes[:j + 1]))) for j in range(len(sizes)))
    publishes = collections.deque()
    while any(per_key.values()):
        publishes.append(per_key[r.choice([k for k in KEYS if per_key[k]])].popleft())
    client = Client()
    expiries = 0
    try:
        for _ in range(40_000):
            quiet = not publishes and not inbox and client.idle()
            if quiet and all(client.seen[k][-1:] == [N - 1] for k in KEYS) and not (expire and stream.sub.leases):
                break
            step = r.choice([s for s, can in (("publish", publishes), ("receive", inbox), ("callback", client.ready),
                                              ("ack", client.acks), ("nack", client.nacks), ("turn", True)) if can])
            if expire and (r.random() < 0.01 or (quiet and stream.sub.leases)):
                step = "expire"  # every lease runs out (and the last ones must, for the end to be reached)
            if step == "expire":
                clock.advance(11)
                expiries += 1
                await asyncio.sleep(0.002)  # the subscription's timer wakes the stream (a millisecond away)
            elif step == "publish":
                k, nums = publishes.popleft()
                raw = _Req(topic=T, messages=[_Msg(data=f"{k}-{n}".encode(), ordering_key=k) for n in nums])
                asyncio.ensure_future(e.publish(T, raw.SerializeToString(), len(nums), k))
            elif step == "receive":
                client.receive(inbox.popleft())
            elif step == "callback":
                client.callback(client.ready.pop(r.randrange(len(client.ready))))
            elif step == "ack":
                cut = r.randint(1, len(client.acks))
                e.delivery.stream_acks(stream, client.acks[:cut])
                del client.acks[:cut]
            elif step == "nack":
                cut = r.randint(1, len(client.nacks))
                e.delivery.modify_deadlines(stream.sub, client.nacks[:cut], [0] * cut)
                del client.nacks[:cut]
            for _ in range(r.choice([1, 5, 30])):
                await asyncio.sleep(0)
    finally:
        server.cancel()
        await e.stop()
    for k in KEYS:
        got = client.seen[k]
        runs = key_runs(got) or [[]]
        said = f"seed {seed}, {shards} shard(s), {outstanding} outstanding, {expiries} expiries: {k} ran {runs}"
        assert runs[0][:1] == [0] and runs[-1][-1:] == [N - 1], said
        assert all((expiries or run[0] % 7 == 3) and run[0] <= before[-1] for before, run in zip(runs, runs[1:])), said
    return expiries


@pytest.mark.parametrize("shards", [1, 2])
def test_a_key_resent_after_a_nack_repeats_every_later_message_and_ends_at_its_last(shards, tmp_path):
    async def go():
        for seed in range(150):
            await _scenario(seed, shards, tmp_path)

    asyncio.run(go())


@pytest.mark.parametrize("shards", [1, 2])
def test_with_leases_running_out_too_a_key_never_skips_ahead_and_ends_at_its_last(shards, tmp_path):
    async def go():
        expiries = 0
        for seed in range(100):
            expiries += await _scenario(seed, shards, tmp_path, expire=True)
        assert expiries > 100  # the clock did jump: leases ran out in every scenario

    asyncio.run(go())
