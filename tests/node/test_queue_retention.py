"""Retention of rescheduled messages, in-process on a simulated clock: a message's retention counts from its latest
reschedule's activation when that is later than its publish, so a periodic job lives as long as it is rescheduled
(its stored batch too: across restarts and journal cuts), while a message never rescheduled is dropped by its
publish time as before."""

from __future__ import annotations

import asyncio
import os

from test_engine import config, publish, pull_all, received, setup, started

from pigeon.broker.topic import msgnum, parse_message_id
from pigeon.testing.clock import SimClock

S = "projects/p/subscriptions/sub-a"
T = "projects/p/topics/topic-a"
RETENTION = 600  # the shortest a subscription may have (10 minutes)


def run(coro):
    return asyncio.run(coro)


async def take(e, n: int = 10, lock: float = 60):
    return received(await e.queue.take(S, n, lock))


async def reschedule(e, job, delay_s: float) -> int:
    return await e.queue.reschedule(S, [job.ack_id], int((e.clock.now() + delay_s) * 1000))


async def upkeep(e, times: int = 3) -> None:
    """Retention, index trimming, checkpoints and journal cuts (a tick between passes, so that checkpoints have
    positions of their own)."""
    for _ in range(times):
        await e.maintain_once()
        await publish(e, [b"tick"])
    await drain(e)


async def drain(e) -> None:
    """Ack whatever plain messages are deliverable (noise, ticks)."""
    while got := await pull_all(e, n=100):
        await e.delivery.acknowledge(S, [m.ack_id for m in got])


def test_a_rescheduled_job_outlives_the_retention_of_its_first_publish(tmp_path):
    """Rescheduled every 5 minutes for 4 times the subscription's retention (10 minutes), with a restart from a
    checkpoint and a crash on the way: delivered after each activation, read from its batch, which neither index
    trimming nor the journal's segment deletion freed. Acked at last, its segments go."""
    async def go():
        clock = SimClock(1_700_000_000.0)
        cfg = config(tmp_path, segment_bytes=16 * 1024 * 1024 + 1, checkpoint_wal_bytes=1)
        e = await started(cfg, clock)
        await setup(e, message_retention_duration={"seconds": RETENTION})
        (job_id,) = await publish(e, [b"job"])
        _, offset, shard = parse_message_id(job_id)
        num = msgnum(offset, shard)
        (job,) = await take(e)
        await reschedule(e, job, 300)
        for _ in range(40):  # ~40 MB after it: the journal has segments that only the job still needs
            await publish(e, [b"x" * 1_000_000])
        await drain(e)
        wal_dir = os.path.join(cfg.data_dir, "wal")
        first_published = clock.now()
        for rnd in range(8):
            assert await take(e) == [], "not before its activation"
            clock.advance(150)
            await upkeep(e)  # while it waits
            if rnd == 3:
                await e.stop()  # a restart from the checkpoint written at the stop
                e = await started(cfg, clock)
            elif rnd == 5:
                await e.journal.close()  # a crash: the last checkpoint and the journal after it
                e = await started(cfg, clock)
            clock.advance(151)
            (job,) = await take(e)
            assert job.message.message_id == job_id and job.message.data == b"job"
            assert job.message.publish_time.seconds == int(first_published)
            await e.maintain_once()  # while it is locked
            await reschedule(e, job, 300)
        assert clock.now() - first_published > 4 * RETENTION
        s = e.state.sub(S)
        assert s.shards[shard].floor > offset and num in s.kept, "below the floor, yet unacked"
        assert e.state.topic(T).shards[shard].first() <= offset, "its index batch is kept"
        assert len(os.listdir(wal_dir)) >= 3, "and the journal segments from it on"
        assert s.backlog() == 1 and s.statistics(clock.now()).parked == 1
        clock.advance(301)
        await e.maintain_once()  # active, not taken yet
        (job,) = await take(e)
        assert job.message.data == b"job"
        assert await e.queue.ack(S, [job.ack_id]) == 1  # done with it: nothing needs the old segments now
        assert num not in s.kept and num not in s.parked and s.backlog() == 0
        await upkeep(e)
        assert len(os.listdir(wal_dir)) == 1
        assert e.state.topic(T).shards[shard].first() > offset
        await e.stop()

    run(go())


def test_messages_never_rescheduled_are_still_dropped_by_their_publish_time(tmp_path):
    """A plain unacked message and a buried one go when the retention of their publish has passed; the job
    rescheduled beside them stays, and goes once its own activation is older than the retention."""
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e, message_retention_duration={"seconds": RETENTION})
        await publish(e, [b"plain", b"buried", b"job"])
        got = {m.message.data: m for m in await take(e, lock=30)}
        assert await e.queue.bury(S, [got[b"buried"].ack_id]) == 1
        at = await reschedule(e, got[b"job"], 400)  # the job: activation at +400 s
        s = e.state.sub(S)
        clock.advance(RETENTION - 1)  # the plain one was redelivered meanwhile (its lock ran out): not acked
        await e.maintain_once()
        assert s.backlog() == 3
        assert [m.message.data for m in await take(e, lock=1)] in ([b"plain", b"job"], [b"job", b"plain"])
        clock.advance(2)  # retention passes the publish of all three; the job's activation was 200 s ago
        await e.maintain_once()
        assert s.backlog() == 1 and await e.queue.kick(S, 10) == 0
        (job,) = await take(e, lock=60)
        assert job.message.data == b"job"  # taken, but neither acked nor rescheduled: its lock runs out
        clock.advance(300)
        await e.maintain_once()
        assert s.backlog() == 1
        clock.advance((at / 1000 + RETENTION) - clock.now() + 1)  # its activation is past the retention now
        await e.maintain_once()
        assert s.backlog() == 0 and not s.parked and not s.kept and not s.leases and not s.versions
        assert await take(e) == [] and await pull_all(e) == []
        await e.stop()

    run(go())
