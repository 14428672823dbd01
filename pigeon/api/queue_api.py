"""The pigeon.v1.Queue gRPC service: translation only (see pigeon/api/proto/pigeon_queue.proto)."""

from __future__ import annotations

import grpc

from pigeon.api import errors, spread
from pigeon.api.errors import translate
from pigeon.api.proto import pigeon_queue_pb2 as q
from pigeon.node.engine import Engine


class QueueApi:
    def __init__(self, engine: Engine):
        self.ops = engine.queue
        self.clock = engine.clock

    @translate
    async def take(self, req, context):
        entries = await self.ops.take(req.subscription, req.max_messages, req.lock_seconds)
        return b"".join(entries)  # received_messages entries are TakeResponse.messages entries on the wire

    @translate
    async def ack(self, req, context):
        return q.AckResponse(acked=await self.ops.ack(req.subscription, list(req.ack_ids))).SerializeToString()

    @translate
    async def reschedule(self, req, context):
        if req.WhichOneof("when") == "delay_seconds":
            at = int((self.clock.now() + max(0.0, req.delay_seconds)) * 1000)
        else:
            at = req.activate_at_ms
        at = await self.ops.reschedule(req.subscription, list(req.ack_ids), at)
        return q.RescheduleResponse(activate_at_ms=at).SerializeToString()

    @translate
    async def bury(self, req, context):
        return q.BuryResponse(buried=await self.ops.bury(req.subscription, list(req.ack_ids))).SerializeToString()

    @translate
    async def kick(self, req, context):
        return q.KickResponse(kicked=await self.ops.kick(req.subscription, req.max_messages)).SerializeToString()

    @translate
    async def update(self, req, context):
        await self.ops.update(req.subscription, req.ack_id, req.data, dict(req.attributes), req.keep_attributes)
        return b""

    @translate
    async def peek(self, req, context):
        message, state, attempts, at = await self.ops.peek(req.subscription, req.message_id)
        return q.PeekResponse(message=message, state=state, delivery_attempt=attempts,
                              activate_at_ms=at).SerializeToString()

    @translate
    async def delete(self, req, context):
        n = await self.ops.delete(req.subscription, list(req.message_ids))
        return q.DeleteResponse(deleted=n).SerializeToString()


SERVICE = "pigeon.v1.Queue"


def _routed(method: str, fn, router, api: "QueueApi"):
    """A cluster node: a call about a subscription whose bundle another node owns goes to that node (every
    request of this service names its subscription); one about a spread topic's goes to the owners of the shards
    it is about (`_spread`)."""
    if router is None:
        return fn

    async def handler(req, context):
        if type(req) is not errors.Unparsable:  # (answered by `fn` as any other bad request)
            try:
                if (t := await router.spread_subscription(req.subscription, context)) is not None:
                    return await _spread(method, req, t, router, api, context)
                if owner := await router.for_subscription(req.subscription, context):
                    return await router.unary(owner, f"/{SERVICE}/{method}", req.SerializeToString(), context,
                                              waits=method == "Take")
            except Exception as e:  # noqa: BLE001 — the boundary, as `translate`
                await errors.abort(context, e)
        return await fn(req, context)

    return handler


def handlers(engine: Engine, router=None) -> list[grpc.GenericRpcHandler]:
    api = QueueApi(engine)
    methods = {"Take": (api.take, q.TakeRequest), "Ack": (api.ack, q.AckRequest),
               "Reschedule": (api.reschedule, q.RescheduleRequest), "Bury": (api.bury, q.BuryRequest),
               "Kick": (api.kick, q.KickRequest), "Update": (api.update, q.UpdateRequest),
               "Peek": (api.peek, q.PeekRequest), "Delete": (api.delete, q.DeleteRequest)}
    return [grpc.method_handlers_generic_handler(SERVICE, {
        name: errors.unary(_routed(name, fn, router, api), req_type) for name, (fn, req_type) in methods.items()})]


async def _spread(method: str, req, t, router, api: QueueApi, context) -> bytes:
    """A queue call about a spread topic's subscription: a Take from every owner (as a Pull); Ack, Bury, Reschedule
    and Delete split by their ids' shards, their counts summed; Update and Peek at the owner of their message's
    shard; Kick at every owner. (The owners answer their part as forwarded calls: this node's own part as well.)"""
    ops, name, path = api.ops, req.subscription, f"/{SERVICE}/{method}"
    if method == "Take":
        async def here(n: int, _now: bool) -> bytes:
            return b"".join(await ops.take(name, n, req.lock_seconds))
        return await spread.pull(router, t, req, context, here, path, waits=False, share=lambda n, _wait: (
            q.TakeRequest(subscription=name, max_messages=n, lock_seconds=req.lock_seconds)))
    if method == "Reschedule" and req.WhichOneof("when") == "delay_seconds":  # one time for every owner
        req.activate_at_ms = int((api.clock.now() + max(0.0, req.delay_seconds)) * 1000)
    if method in ("Ack", "Bury", "Reschedule", "Delete"):
        field, shard = ("message_ids", spread.shard_of_message) if method == "Delete" else ("ack_ids", None)
        local = {"Ack": lambda ids: ops.ack(name, ids), "Bury": lambda ids: ops.bury(name, ids),
                 "Reschedule": lambda ids: ops.reschedule(name, ids, req.activate_at_ms),
                 "Delete": lambda ids: ops.delete(name, ids)}[method]
        got = await spread.split_acks(router, t, req, list(getattr(req, field)), path, context, local, field, shard)
        kind = {"Ack": (q.AckResponse, "acked"), "Bury": (q.BuryResponse, "buried"),
                "Reschedule": (q.RescheduleResponse, "activate_at_ms"), "Delete": (q.DeleteResponse, "deleted")}
        cls, count = kind[method]
        values = [g if isinstance(g, int) else getattr(cls.FromString(g), count) for g in got]
        return cls(**{count: req.activate_at_ms if method == "Reschedule" else sum(values)}).SerializeToString()
    if method == "Kick":
        got = await spread.everywhere(router, t, path, req, context, lambda: ops.kick(name, req.max_messages))
        return q.KickResponse(kicked=sum(g if isinstance(g, int) else q.KickResponse.FromString(g).kicked
                                         for g in got)).SerializeToString()
    shard = spread.shard_of(req.ack_id) if method == "Update" else spread.shard_of_message(req.message_id)
    owner = router.shard_owner(t, shard) if shard is not None and shard < len(t.shards) else None
    if owner is not None:
        return await router.unary(owner, path, req.SerializeToString(), context)
    return await {"Update": api.update, "Peek": api.peek}[method](req, context)
