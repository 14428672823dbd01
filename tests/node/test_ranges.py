"""node.ranges in-process on a simulated clock: range reads are exact and deterministic, data loss is
reported, and a cursor subscription holds retention, shows backlog and survives a restart."""

from __future__ import annotations

import asyncio

import pytest
from google.pubsub_v1 import types

from pigeon.api.proto import pigeon_ranges_pb2 as rpb
from pigeon.core.errors import FailedPrecondition, InvalidArgument
from pigeon.node import ranges
from pigeon.node.engine import Engine
from pigeon.ops.config import Config
from pigeon.testing.clock import SimClock

Topic, Msg, Req = types.Topic.pb(), types.PubsubMessage.pb(), types.PublishRequest.pb()
T = "projects/p/topics/topic-r"
C = "projects/p/subscriptions/cursor-r"


def run(coro):
    return asyncio.run(coro)


async def started(tmp_path, clock) -> Engine:
    e = Engine(Config(data_dir=str(tmp_path / "data"), fsync="never", shards_per_topic=2), clock)
    await e.start()
    e._maintenance.cancel()
    return e


async def publish(e: Engine, datas, key: str = "", **attrs) -> list[str]:
    raw = Req(topic=T, messages=[Msg(data=d, attributes=attrs, ordering_key=key) for d in datas]).SerializeToString()
    return await e.publish(T, raw, len(datas), key)


def messages(r: ranges.Range) -> list:
    """The stored messages of a range, parsed (as a reader would)."""
    out, pos = [], 0
    for n in memoryview(r.lengths).cast("I"):
        out.append(Msg.FromString(r.messages[pos : pos + n]))
        pos += n
    return out


def test_read_range_returns_exactly_the_stored_messages(tmp_path):
    async def go():
        e = await started(tmp_path, SimClock(1_700_000_000.0))
        await e.create_topic(Topic(name=T))
        ids = await publish(e, [b"k%d" % i for i in range(5)], key="K", color="red")
        shard = e.state.topic(T).shard_for("K")
        t, r = ranges.read_range(e, T, shard, 1, 4)
        assert (r.start, r.next, r.lost) == (1, 4, False)
        got = messages(r)
        assert [m.data for m in got] == [b"k1", b"k2", b"k3"]
        assert all(m.ordering_key == "K" and m.attributes["color"] == "red" for m in got)
        assert r.batch_starts == [1] and r.batch_ms == [1_700_000_000_000]
        assert t.message_id(2, shard) == ids[2]
        # the same range again: the same bytes
        assert ranges.read_range(e, T, shard, 1, 4)[1] == r
        await e.stop()

    run(go())


def test_read_range_spans_batches_and_respects_limits(tmp_path):
    async def go():
        e = await started(tmp_path, SimClock(1_700_000_000.0))
        await e.create_topic(Topic(name=T))
        for b in range(4):
            await publish(e, [b"%d-%d" % (b, i) for i in range(10)], key="same")  # one shard
        shard = e.state.topic(T).shard_for("same")
        _, whole = ranges.read_range(e, T, shard, 5, 0)
        assert (whole.start, whole.next) == (5, 40)
        assert whole.batch_starts == [5, 10, 20, 30]
        assert [m.data for m in messages(whole)] == [b"%d-%d" % (i // 10, i % 10) for i in range(5, 40)]
        _, part = ranges.read_range(e, T, shard, 5, 0, max_messages=7)
        assert part.next == 12 and len(messages(part)) == 7
        size = len(Msg(data=b"0-0", ordering_key="same").SerializeToString())
        _, small = ranges.read_range(e, T, shard, 0, 0, max_bytes=3 * size)
        assert small.next == 3
        _, one = ranges.read_range(e, T, shard, 0, 0, max_bytes=1)
        assert one.next == 1  # at least one message
        _, empty = ranges.read_range(e, T, shard, 40, 0)
        assert (empty.start, empty.next, empty.lengths) == (40, 40, b"")
        with pytest.raises(FailedPrecondition):
            ranges.read_range(e, T, shard, 41, 0)  # beyond the end: a recreated topic, or a bug
        with pytest.raises(InvalidArgument):
            ranges.read_range(e, T, 7, 0, 0)
        await e.stop()

    run(go())


def test_data_loss_fails_unless_allowed(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(tmp_path, clock)
        await e.create_topic(Topic(name=T))
        await publish(e, [b"a", b"b"], key="k")
        shard = e.state.topic(T).shard_for("k")
        await e.maintain_once()  # no subscription, no retention: nothing is kept
        await publish(e, [b"c"], key="k")
        assert ranges.latest_offsets(e, T)[1][shard].earliest == 2
        with pytest.raises(FailedPrecondition, match="no longer retained"):
            ranges.read_range(e, T, shard, 0, 0)
        _, r = ranges.read_range(e, T, shard, 0, 0, allow_data_loss=True)
        assert (r.start, r.next, r.lost) == (2, 3, True)
        assert [m.data for m in messages(r)] == [b"c"]
        await e.stop()

    run(go())


def test_cursor_holds_retention_shows_backlog_and_survives_restart(tmp_path):
    async def go():
        clock = SimClock(1_700_000_000.0)
        e = await started(tmp_path, clock)
        await e.create_topic(Topic(name=T))
        c = await ranges.create_cursor(e, C, T, [])
        assert c.created and c.offsets == [0, 0] and c.backlog == 0
        await publish(e, [b"%d" % i for i in range(6)], key="k")
        shard = e.state.topic(T).shard_for("k")
        assert ranges.get_cursor(e, C).backlog == 6
        await e.maintain_once()
        assert ranges.latest_offsets(e, T)[1][shard].earliest == 0  # held by the cursor
        offsets = [0, 0]
        offsets[shard] = 4
        c = await ranges.commit_cursor(e, C, offsets)
        assert c.offsets[shard] == 4 and c.backlog == 2
        c = await ranges.commit_cursor(e, C, [0, 0])  # never back
        assert c.offsets[shard] == 4
        offsets[shard] = 99
        assert (await ranges.commit_cursor(e, C, offsets)).offsets[shard] == 6  # clamped to the end
        again = await ranges.create_cursor(e, C, T, [0, 0])  # exists: unchanged
        assert not again.created and again.offsets[shard] == 6
        with pytest.raises(InvalidArgument):
            await ranges.commit_cursor(e, C, [1])
        await e.stop()
        e = await started(tmp_path, clock)
        assert ranges.get_cursor(e, C).offsets[shard] == 6
        sub = e.state.sub(C)
        assert sub.config.labels[ranges.CURSOR_LABEL] == "true"
        assert not sub.config.expiration_policy.HasField("ttl")  # never expires for inactivity
        await e.stop()

    run(go())


def test_cursor_created_at_given_offsets_and_topic_checks(tmp_path):
    async def go():
        e = await started(tmp_path, SimClock(1_700_000_000.0))
        await e.create_topic(Topic(name=T))
        await ranges.create_cursor(e, "projects/p/subscriptions/holder", T, [])
        await publish(e, [b"a", b"b", b"c"], key="k")
        shard = e.state.topic(T).shard_for("k")
        offsets = [0, 0]
        offsets[shard] = 1
        c = await ranges.create_cursor(e, C, T, offsets)
        assert c.offsets[shard] == 1 and c.backlog == 2
        await e.create_topic(Topic(name="projects/p/topics/other"))
        with pytest.raises(FailedPrecondition):
            await ranges.create_cursor(e, C, "projects/p/topics/other", [])
        uid = e.state.topic(T).uid
        with pytest.raises(FailedPrecondition, match="created again"):
            ranges.read_range(e, T, shard, 0, 0, topic_uid=uid + 100)
        await e.stop()

    run(go())


def test_read_range_response_parses_as_the_proto(tmp_path):
    """The service splices the big fields after the rest; the result must be a valid ReadRangeResponse."""
    from pigeon.api import pigeon_api

    class Ctx:
        async def abort(self, code, msg, trailing_metadata=()):
            raise AssertionError((code, msg))

    async def go():
        e = await started(tmp_path, SimClock(1_700_000_000.0))
        await e.create_topic(Topic(name=T))
        await publish(e, [b"x" * 300, b"y"], key="k")
        shard = e.state.topic(T).shard_for("k")
        api = pigeon_api.RangesApi(e)
        raw = await api.read_range(rpb.ReadRangeRequest(topic=T, shard=shard), Ctx())
        r = rpb.ReadRangeResponse.FromString(raw)
        assert (r.start_offset, r.next_offset, r.topic_uid, r.shard_bits) == (0, 2, e.state.topic(T).uid, 6)
        assert len(r.messages) == sum(memoryview(r.lengths).cast("I"))
        raw = await api.latest_offsets(rpb.LatestOffsetsRequest(topic=T), Ctx())
        lo = rpb.LatestOffsetsResponse.FromString(raw)
        assert lo.shard_count == 2 and lo.shards[shard].latest == 2
        await e.stop()

    run(go())
