"""Who wakes when: a subscription's Signal wakes one waiter at a time and the waiter that takes messages passes
the wake on; a stream held back by flow control waits for its own acks only. Counts of deliver attempts show the
absence of a thundering herd; the messages delivered show nothing is lost or stranded."""

from __future__ import annotations

import asyncio

from google.pubsub_v1 import types

from pigeon.node.delivery import Delivery
from pigeon.node.engine import Engine
from pigeon.node.reader import MessageReader
from pigeon.node.streams import Signal
from pigeon.ops.config import Config
from pigeon.testing.clock import SimClock

T = "projects/p/topics/wake"
S = "projects/p/subscriptions/wake"
_Topic, _Sub, _Req, _Msg, _Resp = (getattr(types, n).pb() for n in
                                   ("Topic", "Subscription", "PublishRequest", "PubsubMessage", "PullResponse"))


class CountingDelivery(Delivery):
    """The real delivery, counting how often a waiter tried to take messages."""

    attempts = 0

    def deliver(self, *args, **kwargs):
        self.attempts += 1
        return super().deliver(*args, **kwargs)


async def _engine(tmp_path) -> Engine:
    e = Engine(Config(data_dir=str(tmp_path / "data"), fsync="never", shards_per_topic=1), SimClock())
    e.delivery = CountingDelivery(e)
    await e.start()
    e._maintenance.cancel()
    await e.create_topic(_Topic(name=T))
    await e.create_subscription(_Sub(name=S, topic=T, ack_deadline_seconds=60))
    return e


async def _publish(e: Engine, n: int) -> None:
    raw = _Req(topic=T, messages=[_Msg(data=b"m%d" % i) for i in range(n)]).SerializeToString()
    await e.publish(T, raw, n, "")


def _ack_ids(entries: list[bytes]) -> list[str]:
    return [m.ack_id for m in _Resp.FromString(b"".join(entries)).received_messages]


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class Consumers:
    """`n` streams, each looping on stream_next and recording what it got (acks are the test's business)."""

    def __init__(self, e: Engine, n: int, max_messages: int):
        self.e = e
        self.streams = [e.delivery.open_stream(S, f"c{i}", 60, max_messages, 0) for i in range(n)]
        self.got: list[list[str]] = [[] for _ in range(n)]
        self.tasks = [asyncio.create_task(self._run(i)) for i in range(n)]

    async def _run(self, i: int) -> None:
        while (out := await self.e.delivery.stream_next(self.streams[i])) is not None:
            self.got[i].extend(_ack_ids(out))

    def total(self) -> int:
        return sum(len(g) for g in self.got)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def test_one_publish_wakes_one_of_many_waiting_streams(tmp_path):
    async def go():
        e = await _engine(tmp_path)
        c = Consumers(e, 200, 100)
        await _settle()
        before = e.delivery.attempts  # each stream tried once and went to sleep
        assert before == 200
        await _publish(e, 1)
        await _settle()
        assert c.total() == 1
        assert e.delivery.attempts - before == 2  # the one woken took it and looked once more; 199 slept on
        await c.stop()
        await e.stop()

    asyncio.run(go())


def test_a_burst_is_passed_along_until_taken_and_streams_take_turns(tmp_path):
    async def go():
        e = await _engine(tmp_path)
        c = Consumers(e, 50, 10)  # each stream may hold 10
        await _settle()
        await _publish(e, 120)  # more than one stream may take: the wake is passed on
        await _settle()
        assert c.total() == 120
        assert [len(g) for g in c.got if g] == [10] * 12  # twelve streams, each up to its flow control
        # the next single messages go to streams that have waited longest, not to the same one again
        for _ in range(5):
            await _publish(e, 1)
            await _settle()
        takers = [i for i, g in enumerate(c.got) if len(g) == 1]
        assert len(takers) == 5
        await c.stop()
        await e.stop()

    asyncio.run(go())


def test_a_full_stream_wakes_for_its_own_acks_only(tmp_path):
    async def go():
        e = await _engine(tmp_path)
        full = Consumers(e, 1, 2)
        await _settle()
        await _publish(e, 2)
        await _settle()
        assert full.total() == 2 and full.streams[0].room() == 0
        others = Consumers(e, 20, 1)
        await _settle()
        await _publish(e, 1)
        await _settle()
        assert others.total() == 1 and full.total() == 2  # the waiting streams got it, the full one slept
        attempts = e.delivery.attempts
        taker = next(i for i, g in enumerate(others.got) if g)
        e.delivery.stream_acks(others.streams[taker], others.got[taker])  # another stream's ack: not the full one's room
        await _settle()
        assert e.delivery.attempts == attempts + 1  # only the taker, freed by its own ack, looked again
        e.delivery.stream_acks(full.streams[0], full.got[0][:1])
        await _publish(e, 1)
        await _settle()
        assert full.total() + others.total() == 4
        await full.stop()
        await others.stop()
        await e.stop()

    asyncio.run(go())


def test_nacked_messages_reach_a_waiting_stream(tmp_path):
    async def go():
        e = await _engine(tmp_path)
        c = Consumers(e, 10, 5)
        await _settle()
        await _publish(e, 5)
        await _settle()
        (holder,) = [i for i, g in enumerate(c.got) if g]
        e.delivery.modify_deadlines(e.state.sub(S), c.got[holder], [0] * 5)
        await _settle()
        assert c.total() == 10  # all five delivered again, to the waiting streams
        await c.stop()
        await e.stop()

    asyncio.run(go())


def test_signal_wakes_oldest_first_and_all_when_asked():
    async def go():
        sig = Signal()
        order: list[int] = []

        async def waiter(i):
            await sig.wait(30)
            order.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(4)]
        await _settle()
        sig.notify()
        await _settle()
        assert order == [0]
        sig.notify()
        await _settle()
        assert order == [0, 1]
        sig.notify_all()
        await _settle()
        assert sorted(order) == [0, 1, 2, 3]
        await asyncio.gather(*tasks)

    asyncio.run(go())


def test_a_waiter_cancelled_as_it_is_woken_passes_the_wake_on():
    async def go():
        sig = Signal()
        woke: list[int] = []

        async def waiter(i):
            await sig.wait(30)
            woke.append(i)

        first = asyncio.create_task(waiter(0))
        second = asyncio.create_task(waiter(1))
        await _settle()
        sig.notify()  # chooses the first ...
        first.cancel()  # ... which is cancelled before it runs
        await _settle()
        assert woke == [1] and first.cancelled()
        await second

    asyncio.run(go())


def test_timer_wakes_one_waiter_at_the_earliest_time_asked():
    async def go():
        sig = Signal()
        loop = asyncio.get_running_loop()
        woke: list[int] = []

        async def waiter(i):
            await sig.wait(30)
            woke.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await _settle()
        sig.wake_at(loop.time() + 5)
        sig.wake_at(loop.time() + 0.05)  # earlier: replaces the later time
        sig.wake_at(loop.time() + 1)  # later than the one kept: ignored
        await asyncio.sleep(0.2)
        assert woke == [0]
        sig.notify_all()
        await asyncio.gather(*tasks)

    asyncio.run(go())


def test_waiters_that_time_out_do_not_pile_up():
    async def go():
        sig = Signal()
        for _ in range(50):
            await asyncio.gather(*[sig.wait(0.001) for _ in range(20)])
        assert len(sig._futs) <= 40  # timed-out entries are swept, not kept forever

    asyncio.run(go())


def test_a_waiting_stream_gets_a_batch_before_its_publisher_is_answered_without_reading_it_back(tmp_path):
    """End-to-end latency is publish → delivery: the journal's durable callback shows the batch to the waiting
    stream one turn of the loop before the publisher's answer, and the stream takes it from the cache the publish
    filled — the same bytes a read of the record gives."""
    async def go():
        e = await _engine(tmp_path)
        c = Consumers(e, 1, 100)
        await _settle()
        events: list[str] = []
        c.got[0] = _Recorder(events)
        raw = _Req(topic=T, messages=[_Msg(data=b"x", attributes={"a": "1"}, ordering_key="k")]).SerializeToString()
        await e.publish(T, raw, 1, "k")
        events.append("answered")
        await _settle()
        assert events == ["delivered", "answered"]
        assert e.reader.statistics().disk_reads == 0
        pos = e.state.topic(T).shards[0].pos[-1]
        assert MessageReader(e.journal, 1 << 20).batch(pos) == e.reader.batch(pos)  # read back: the same batch
        await c.stop()
        await e.stop()

    asyncio.run(go())


def test_a_batch_is_handed_out_only_once_its_publisher_has_the_answer(tmp_path):
    """A publish through gRPC passes `answered`: the batch — and every later one of its shard — waits for the
    handler to have its answer, so a subscriber never has a message before its publisher's answer (Node's system tests publish,
    then wait for the message with the id they got: one delivered first was ignored and stayed leased). A
    publish without it (the engine's own, a dead letter) is shown as it turns durable."""
    async def go():
        e = await _engine(tmp_path)
        c = Consumers(e, 1, 100)
        await _settle()
        ended: list = []
        raw = _Req(topic=T, messages=[_Msg(data=b"first")]).SerializeToString()
        await e.publish(T, raw, 1, "", answered=ended.append)
        await _publish(e, 2)  # a later batch, durable and shown: it does not carry the first past its answer
        await _settle()
        assert c.total() == 0 and len(ended) == 1
        ended.pop()()  # the first publisher's answer is sent
        await _settle()
        assert c.total() == 3
        await _publish(e, 1)  # nobody waits for an answer: shown as it turns durable
        await _settle()
        assert c.total() == 4
        await c.stop()
        await e.stop()

    asyncio.run(go())


def test_a_batch_nobody_waits_for_is_not_kept_in_memory(tmp_path):
    async def go():
        e = await _engine(tmp_path)
        await _publish(e, 10)
        assert e.reader.statistics().cached_batches == 0  # a backlog costs no memory until it is read
        msgs = await e.delivery.pull(S, 100, True, 5)
        assert len(msgs) == 10 and e.reader.statistics().disk_reads == 1
        await e.stop()

    asyncio.run(go())


class _Recorder(list):
    """Stands in for a consumer's list of ack ids: notes when the first delivery arrived."""

    def __init__(self, events: list[str]):
        super().__init__()
        self.events = events

    def extend(self, ids) -> None:
        self.events.append("delivered")
        super().extend(ids)


def test_a_batch_whose_publisher_went_away_is_shown_once_durable(tmp_path):
    """A publisher that cancels (a deadline, a disconnect) while its batch is on its way to disk does not hide the
    batch: the journal's durable callback shows it, not the publisher's coroutine (before, it stayed invisible
    until the next publish to its shard, or a restart)."""
    async def go():
        e = await _engine(tmp_path)
        raw = _Req(topic=T, messages=[_Msg(data=b"orphan")]).SerializeToString()
        publishing = asyncio.create_task(e.publish(T, raw, 1, ""))
        await asyncio.sleep(0)  # committed; waiting for the journal
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
        await e.durable()
        got = await e.delivery.pull(S, 10, True, 5)
        assert [m.message.data for m in _Resp.FromString(b"".join(got)).received_messages] == [b"orphan"]
        await e.stop()

    asyncio.run(go())
