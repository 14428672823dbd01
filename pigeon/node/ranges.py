"""Offset-range reads and cursors for data pipelines (the pigeon.v1.Ranges service). Owns the rules:
- a range read returns exactly the messages stored at those offsets, and only durable ones: the same
  range always returns the same messages while it is retained;
- a range starting below the oldest retained offset fails unless the caller accepts the loss, and then
  says where it really starts;
- a cursor is an ordinary subscription whose ack floor only moves forward, through a logged `sub.reset`:
  retention keeps what it has not passed and its backlog is the subscription's backlog.

Functions take the engine; nothing here keeps state of its own."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from pigeon.broker import commands, resources
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.topic import TopicState
from pigeon.core import limits
from pigeon.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from pigeon.node.reader import NotCached

range_messages_default = limits.range_messages_default
range_messages_max = limits.range_messages_max
range_bytes_default = limits.range_bytes_default
range_bytes_max = limits.range_bytes_max
CURSOR_LABEL = "pigeon-cursor"


@dataclass(frozen=True)
class ShardOffsets:
    earliest: int
    latest: int
    at_time: int


@dataclass(frozen=True)
class Range:
    start: int  # first offset returned
    next: int  # offset after the last one returned
    lost: bool  # the request's start was below `start` and no longer retained
    lengths: bytes  # uint32 per message
    messages: bytes  # stored PubsubMessages, concatenated
    batch_starts: list[int]
    batch_ms: list[int]


def latest_offsets(engine, topic_name: str, at_ms: int | None = None) -> tuple[TopicState, list[ShardOffsets]]:
    t = engine.state.topic(topic_name)
    out = []
    for ix in t.shards:
        at = min(ix.offset_at_ms(at_ms), ix.durable) if at_ms is not None else 0
        out.append(ShardOffsets(min(ix.first(), ix.durable), ix.durable, at))
    return t, out


def _topic(engine, topic_name: str, uid: int) -> TopicState:
    t = engine.state.topic(topic_name)
    if uid and t.uid != uid:
        raise FailedPrecondition(
            f"The topic {topic_name} was deleted and created again: offsets of the old topic do not apply to it."
        )
    return t


async def read_range_when_read(engine, *args, **kwargs) -> tuple[TopicState, Range]:
    """`read_range`, fetching first the batches a cluster node must read from other nodes (node.reader)."""
    for _ in range(limits.fetch_tries):
        try:
            return read_range(engine, *args, **kwargs)
        except NotCached as e:
            await engine.reader.fetch(e.address)
    raise Unavailable("Messages could not be read back from the ledgers that hold them; retry.")


def read_range(engine, topic_name: str, shard: int, start: int, end: int, max_messages: int = 0,
               max_bytes: int = 0, allow_data_loss: bool = False, topic_uid: int = 0) -> tuple[TopicState, Range]:
    t = _topic(engine, topic_name, topic_uid)
    if not 0 <= shard < len(t.shards):
        raise InvalidArgument(f"shard must be in 0..{len(t.shards) - 1} for {topic_name} (got {shard}).")
    if start < 0 or end < 0 or max_messages < 0 or max_bytes < 0:
        raise InvalidArgument("start_offset, end_offset, max_messages and max_bytes must not be negative.")
    max_messages = min(max_messages or range_messages_default, range_messages_max)
    max_bytes = min(max_bytes or range_bytes_default, range_bytes_max)
    ix = t.shards[shard]
    durable = ix.durable
    if start > durable:
        raise FailedPrecondition(
            f"start_offset {start} lies beyond the end of shard {shard} of {topic_name} ({durable}): "
            "was the topic deleted and created again?"
        )
    end = durable if end == 0 or end > durable else end
    first = ix.first()
    lost = False
    if start < first:
        if not allow_data_loss:
            raise FailedPrecondition(
                f"Messages from offset {start} of shard {shard} of {topic_name} are no longer retained: the oldest "
                f"retained offset is {first}."
            )
        start, end, lost = first, max(end, first), True
    stop = min(end, start + max_messages)
    parts: list[bytes] = []
    lengths = array("I")
    starts: list[int] = []
    times: list[int] = []
    offset, size = start, 0
    if offset < stop:
        i = ix.batch_of(offset)
        while offset < stop and size < max_bytes:
            base = ix.base[i]
            hi = min(ix.batch_end(i), stop)
            msgs = engine.reader.batch(ix.pos[i])[0][offset - base : hi - base]
            sizes = array("I", map(len, msgs))
            room, total = max_bytes - size, sum(sizes)
            if total > room:  # cut inside this batch, keeping at least one message overall
                n = acc = 0
                for length in sizes:
                    if acc + length > room and (n or parts):
                        break
                    acc += length
                    n += 1
                if n == 0:
                    break
                msgs, sizes, hi = msgs[:n], sizes[:n], offset + n
                size = max_bytes  # full
            else:
                size += total
            starts.append(offset)
            times.append(ix.ms[i])
            parts.extend(msgs)
            lengths.extend(sizes)
            offset = hi
            i += 1
    return t, Range(start, offset, lost, lengths.tobytes(), b"".join(parts), starts, times)


# --- cursors ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CursorView:
    name: str
    topic: str
    topic_uid: int
    offsets: list[int]
    latest: list[int]
    backlog: int
    created: bool
    acked: list[list[int]]  # per shard, the offsets acknowledged above its floor


def _view(s: SubscriptionState, created: bool = False) -> CursorView:
    t = s.topic
    latest = [ix.durable for ix in t.shards] if t is not None else [sh.floor for sh in s.shards]
    floors, acked = s.export_state()
    return CursorView(s.name, t.name if t is not None else s.config.topic, t.uid if t is not None else 0,
                      floors, latest, s.backlog(), created, acked)


def _clamp(t: TopicState, offsets: list[int]) -> list[int]:
    if len(offsets) != len(t.shards):
        raise InvalidArgument(f"offsets must list one offset per shard ({len(t.shards)} for {t.name}).")
    if any(o < 0 for o in offsets):
        raise InvalidArgument("offsets must not be negative.")
    return [max(min(o, ix.durable), ix.first()) for o, ix in zip(offsets, t.shards)]


async def _move(engine, s: SubscriptionState, floors: list[int]) -> None:
    """Set the ack floors (a Seek record), keeping acks above them (filters ack rejected messages ahead)."""
    await engine.change(*engine.own_part(commands.move_floors(s, floors)))


async def create_cursor(engine, name: str, topic_name: str, offsets: list[int],
                        start: list[int] | None = None) -> CursorView:
    """Create the cursor subscription at `offsets` (empty: the latest offsets), or return it as it is. `start`: a
    spread topic's offsets, chosen from its shards' owners' (api.spread), which it starts at."""
    engine.check_open()
    t = engine.state.topic(topic_name)
    s = engine.state.subs.get(name)
    if s is not None:
        if s.topic is not t:
            raise FailedPrecondition(f"The subscription {name} exists for another topic ({s.config.topic}).")
        return _view(s)
    sub = resources.Subscription(name=name, topic=topic_name)
    sub.labels[CURSOR_LABEL] = "true"
    sub.expiration_policy.SetInParent()  # no ttl: a cursor is deleted explicitly, never for inactivity
    await engine.create_subscription(sub, start)
    s = engine.state.sub(name)
    if offsets and start is None:
        floors = _clamp(t, list(offsets))
        if floors != [sh.floor for sh in s.shards]:
            await _move(engine, s, floors)
    return _view(s, created=True)


def get_cursor(engine, name: str) -> CursorView:
    return _view(engine.state.sub(name))


async def commit_cursor(engine, name: str, offsets: list[int]) -> CursorView:
    """Everything below `offsets` was consumed: move the floors forward (never back)."""
    engine.check_open()
    s = engine.state.sub(name)
    t = s.topic
    if t is None or t.deleted:
        raise FailedPrecondition(f"The topic of {name} was deleted.")
    floors = [max(sh.floor, o) for sh, o in zip(s.shards, _clamp(t, list(offsets)))]
    s.last_activity = engine.clock.now()
    if floors != [sh.floor for sh in s.shards]:
        await _move(engine, s, floors)
    return _view(s)
