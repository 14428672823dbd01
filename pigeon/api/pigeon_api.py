"""The pigeon.v1.Ranges gRPC surface (offset-range reads and cursors for data pipelines). Translation only,
like grpc_api: the rules live in node.ranges; a PigeonError becomes its status through grpc_api's
boundary. Responses are serialized here; ReadRange's message bytes are spliced, never re-encoded. On a cluster node a
call about a topic (or cursor) whose bundle another node owns goes to that node through the router (api.router),
as every call of the Pub/Sub API does: only the owner holds the topic's offsets and messages."""

from __future__ import annotations

import grpc

from pigeon.api import errors, spread
from pigeon.api.access import COPY
from pigeon.api.errors import translate
from pigeon.api.proto import pigeon_ranges_pb2 as pb
from pigeon.core import limits, wire
from pigeon.node import ranges
from pigeon.node.engine import Engine

SERVICE = "pigeon.v1.Ranges"


def _cursor(c: ranges.CursorView) -> bytes:
    return pb.Cursor(name=c.name, topic=c.topic, offsets=c.offsets, latest=c.latest, backlog=c.backlog,
                     created=c.created, topic_uid=c.topic_uid,
                     acked=[pb.AckedAbove(offsets=a) for a in c.acked]).SerializeToString()


class RangesApi:
    def __init__(self, engine: Engine, router=None):
        self.engine = engine
        self.router = router  # a cluster node's: calls about other nodes' bundles go there

    async def _owner_topic(self, method: str, req, context) -> bytes | None:
        """The owner's answer when another node owns `req.topic`'s bundle; None to answer here."""
        if self.router is not None and req.topic and (owner := self.router.for_topic(req.topic, context)):
            return await self.router.unary(owner, f"/{SERVICE}/{method}", req.SerializeToString(), context)
        return None

    async def _owner_cursor(self, method: str, req, context) -> bytes | None:
        """`_owner_topic` for a call naming its cursor (a subscription: its bundle is its topic's)."""
        if self.router is not None and req.name and (owner := await self.router.for_subscription(req.name, context)):
            return await self.router.unary(owner, f"/{SERVICE}/{method}", req.SerializeToString(), context)
        return None

    @translate
    async def latest_offsets(self, req, context):
        if self.router is not None and (t := await self.router.spread_topic(req.topic, context)) is not None:
            return await spread.latest_offsets(self.router, t, req, context, lambda: _now(self._latest(req)))
        if (forwarded := await self._owner_topic("LatestOffsets", req, context)) is not None:
            return forwarded
        return self._latest(req)

    def _latest(self, req) -> bytes:
        at = req.at_time_ms if req.HasField("at_time_ms") else None
        t, shards = ranges.latest_offsets(self.engine, req.topic, at)
        out = pb.LatestOffsetsResponse(shard_count=len(shards), topic_uid=t.uid, offset_bits=limits.topic_offset_bits,
                                       shard_bits=limits.shard_bits)
        for i, s in enumerate(shards):
            out.shards.add(shard=i, earliest=s.earliest, latest=s.latest, at_time=s.at_time)
        return out.SerializeToString()

    @translate
    async def read_range(self, req, context):
        if self.router is not None and (t := await self.router.spread_topic(req.topic, context)) is not None:
            if owner := self.router.shard_owner(t, req.shard):  # a shard's messages are read at its owner
                return await self.router.unary(owner, f"/{SERVICE}/ReadRange", req.SerializeToString(), context)
        elif (forwarded := await self._owner_topic("ReadRange", req, context)) is not None:
            return forwarded
        t, r = await ranges.read_range_when_read(self.engine, req.topic, req.shard, req.start_offset,
                                                 req.end_offset, req.max_messages, req.max_bytes, req.allow_data_loss,
                                                 req.topic_uid)
        if t.copied is not None and any(k == COPY for k, _ in context.invocation_metadata() or ()):
            t.copied[req.shard] = max(t.copied[req.shard], req.start_offset)  # (a copy's read: node.copies)
        head = pb.ReadRangeResponse(start_offset=r.start, next_offset=r.next, data_lost=r.lost,
                                    batch_starts=r.batch_starts, batch_publish_ms=r.batch_ms, topic_uid=t.uid,
                                    offset_bits=limits.topic_offset_bits, shard_bits=limits.shard_bits)
        # the two big fields are appended as raw bytes: one copy, no protobuf object around them
        out = head.SerializeToString()
        if r.lengths:
            out += wire.length_delimited(4, r.lengths) + wire.length_delimited(5, r.messages)
        return out

    @translate
    async def create_cursor(self, req, context):
        if self.router is not None and (t := await self.router.spread_topic(req.topic, context)) is not None:
            start = None
            if req.name not in self.engine.state.subs:  # it starts where each shard's owner says
                latest = pb.LatestOffsetsResponse.FromString(await spread.latest_offsets(
                    self.router, t, pb.LatestOffsetsRequest(topic=req.topic), context,
                    lambda: _now(self._latest(pb.LatestOffsetsRequest(topic=req.topic)))))
                start = spread.clamped(list(req.offsets), latest.shards, len(t.shards))
            made = await ranges.create_cursor(self.engine, req.name, req.topic, list(req.offsets), start)
            return await self._spread_cursor(t, req.name, context, made.created)
        if (forwarded := await self._owner_topic("CreateCursor", req, context)) is not None:
            return forwarded
        return _cursor(await ranges.create_cursor(self.engine, req.name, req.topic, list(req.offsets)))

    async def _spread_cursor(self, t, name: str, context, created: bool = False) -> bytes:
        """A cursor of a spread topic: each shard's part as its owner has it."""
        return await spread.cursor(self.router, t, name, context,
                                   lambda: _now(_cursor(ranges.get_cursor(self.engine, name))), created)

    @translate
    async def get_cursor(self, req, context):
        if self.router is not None and (t := await self.router.spread_subscription(req.name, context)) is not None:
            return await self._spread_cursor(t, req.name, context)
        if (forwarded := await self._owner_cursor("GetCursor", req, context)) is not None:
            return forwarded
        return _cursor(ranges.get_cursor(self.engine, req.name))

    @translate
    async def commit_cursor(self, req, context):
        if self.router is not None and (t := await self.router.spread_subscription(req.name, context)) is not None:
            await spread.everywhere(self.router, t, f"/{SERVICE}/CommitCursor", req, context,  # each its shards
                                    lambda: ranges.commit_cursor(self.engine, req.name, list(req.offsets)))
            return await self._spread_cursor(t, req.name, context)
        if (forwarded := await self._owner_cursor("CommitCursor", req, context)) is not None:
            return forwarded
        return _cursor(await ranges.commit_cursor(self.engine, req.name, list(req.offsets)))


def handlers(engine: Engine, router=None) -> list[grpc.GenericRpcHandler]:
    api = RangesApi(engine, router)

    methods = {
        "LatestOffsets": errors.unary(api.latest_offsets, pb.LatestOffsetsRequest),
        "ReadRange": errors.unary(api.read_range, pb.ReadRangeRequest),
        "CreateCursor": errors.unary(api.create_cursor, pb.CreateCursorRequest),
        "GetCursor": errors.unary(api.get_cursor, pb.GetCursorRequest),
        "CommitCursor": errors.unary(api.commit_cursor, pb.CommitCursorRequest),
    }
    return [grpc.method_handlers_generic_handler(SERVICE, methods)]


async def _now(value):
    return value
