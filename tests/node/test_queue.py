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
        await e.wal.close()  # crash: the window survives through the log
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
