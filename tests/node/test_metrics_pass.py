"""Above `fresh_max` subscriptions, /metrics reads their statistics in a background pass between turns of the
event loop; scrapes get the latest pass and its age, and a pass starts again once the last is `every` old."""

from __future__ import annotations

import asyncio

from pigeon.api.metrics import SubscriptionStats
from pigeon.testing.clock import SimClock
from tests.node.test_engine import PB, T, config, publish, started


def test_many_subscriptions_are_read_in_a_background_pass(tmp_path):
    async def go():
        e = await started(config(tmp_path), SimClock(1_700_000_000.0))
        try:
            await e.create_topic(PB["Topic"](name=T))
            for i in range(7):
                await e.create_subscription(PB["Subscription"](name=f"projects/p/subscriptions/s-{i}", topic=T))
            await publish(e, [b"a", b"b"])
            stats = SubscriptionStats(e, fresh_max=3, every=0.2, chunk=2)
            first, age = stats.read()
            assert first == [] and age == 0.0, "no pass yet: it starts now"
            await asyncio.sleep(0.05)
            got, age = stats.read()
            assert sorted(s.name for s in got) == [f"projects/p/subscriptions/s-{i}" for i in range(7)]
            assert all(s.undelivered == 2 for s in got) and 0 <= age < 0.2
            await e.create_subscription(PB["Subscription"](name="projects/p/subscriptions/s-new", topic=T))
            assert len(stats.read()[0]) == 7, "the same pass until it is `every` old"
            await asyncio.sleep(0.25)
            stats.read()
            await asyncio.sleep(0.05)
            assert len(stats.read()[0]) == 8, "then a new one"
        finally:
            await e.stop()

    asyncio.run(go())
