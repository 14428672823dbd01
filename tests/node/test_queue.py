"""Queue-server semantics in-process on a simulated clock: idempotent publish, delayed activation,
reschedule, bury/kick, peek/delete/update by id."""

from __future__ import annotations

import asyncio

from test_engine import PB, S, T, config, pull_all, setup, started

from pigeon.testing.clock import SimClock

KEY = "pigeon-idempotency-key"


def run(coro):
    return asyncio.run(coro)


async def publish_attrs(e, items):
    """items: [(data, attributes)] in one request."""
    msgs = [PB["PubsubMessage"](data=d, attributes=a) for d, a in items]
    raw = PB["PublishRequest"](topic=T, messages=msgs).SerializeToString()
    keys = [a.get(KEY, "") for _, a in items]
    return await e.publish(T, raw, len(msgs), "", keys if any(keys) else None)


def data(ms):
    return [m.message.data for m in ms]


def test_duplicate_key_returns_original_id_and_stores_nothing(tmp_path):
    async def go():
        clock = SimClock()
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await setup(e)
        (first,) = await publish_attrs(e, [(b"one", {KEY: "k1"})])
        again = await publish_attrs(e, [(b"one-again", {KEY: "k1"}), (b"two", {KEY: "k2"}), (b"two-dup", {KEY: "k2"})])
        assert again[0] == first and again[1] == again[2] and again[1] != first
        assert sorted(data(await pull_all(e))) == [b"one", b"two"]
        await e.journal.close()  # crash: the window survives through the log
        e2 = await started(cfg, clock)
        assert await publish_attrs(e2, [(b"x", {KEY: "k1"})]) == [first]
        await e2.checkpoint()
        await e2.stop()
        e3 = await started(cfg, clock)  # and through a checkpoint
        assert await publish_attrs(e3, [(b"x", {KEY: "k2"})]) == [again[1]]
        clock.advance(15 * 60 + 1)  # past the window the key is new again
        await e3.maintain_once()
        (fresh,) = await publish_attrs(e3, [(b"one-later", {KEY: "k1"})])
        assert fresh != first
        await e3.stop()

    run(go())


async def publish_at(e, d: bytes, activate_at: str = "", delay: str = ""):
    attrs = {}
    if activate_at:
        attrs["pigeon-activate-at"] = activate_at
    if delay:
        attrs["pigeon-delay"] = delay
    msgs = [PB["PubsubMessage"](data=d, attributes=attrs)]
    raw = PB["PublishRequest"](topic=T, messages=msgs).SerializeToString()
    return await e.publish(T, raw, 1, "", None, [(activate_at, delay)])


def test_delayed_message_waits_for_its_time(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e)
        await publish_at(e, b"later", delay="60s")
        await e.publish(T, PB["PublishRequest"](topic=T, messages=[PB["PubsubMessage"](data=b"now")]).SerializeToString(), 1, "")
        got = await pull_all(e)
        assert data(got) == [b"now"]
        await e.delivery.acknowledge(S, [got[0].ack_id])
        clock.advance(59)
        assert await pull_all(e) == []
        clock.advance(1.5)
        assert data(await pull_all(e)) == [b"later"]
        await e.stop()

    run(go())


def test_activation_order_even_in_the_past_and_across_restart(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        cfg = config(tmp_path)
        e = await started(cfg, clock)
        await setup(e)
        base = 1_700_000_000_000
        await publish_at(e, b"c", activate_at=str(base + 30_000))
        await publish_at(e, b"a", activate_at=str(base + 10_000))
        await publish_at(e, b"old", activate_at="2023-11-14T22:00:00Z")  # long past: first in line
        await publish_at(e, b"b", activate_at=str(base + 20_000))
        assert data(await pull_all(e)) == [b"old"]
        await e.journal.close()  # crash: replay rebuilds the index
        e2 = await started(cfg, clock)
        clock.advance(31)
        got = await pull_all(e2)
        assert data(got) == [b"old", b"a", b"b", b"c"]  # "old" was never acked: it comes again, first
        await e2.delivery.acknowledge(S, [m.ack_id for m in got[:2]])
        await e2.checkpoint()
        await e2.stop()
        e3 = await started(cfg, clock)  # and from a checkpoint (which keeps the locks of e2's pull)
        assert await pull_all(e3) == []
        clock.advance(10)
        assert data(await pull_all(e3)) == [b"b", b"c"]
        await e3.stop()

    run(go())


def test_late_entry_behind_the_walk_is_still_delivered(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e)
        await publish_at(e, b"first", delay="5s")
        clock.advance(10)
        assert data(await pull_all(e)) == [b"first"]  # the walk is now past second +5
        await publish_at(e, b"behind", activate_at=str(1_700_000_002_000))
        assert data(await pull_all(e)) == [b"behind"]
        await e.stop()

    run(go())


def test_walked_and_acked_seconds_are_forgotten(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(config(tmp_path), clock)
        await setup(e)
        for i in range(3):
            await publish_at(e, b"d%d" % i, delay=f"{i + 1}s")
        clock.advance(5)
        got = await pull_all(e)
        assert len(got) == 3
        await e.maintain_once()
        assert e.state.topic(T).schedule.count == 3  # unacked: still needed after a restart
        await e.delivery.acknowledge(S, [m.ack_id for m in got])
        await e.maintain_once()
        # every walked second goes, but the one holding the walk's mark (entries may still join it)
        assert e.state.topic(T).schedule.count == 1
        await e.stop()

    run(go())
