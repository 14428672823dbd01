"""The pigeon.v1.Queue gRPC service: translation only (see pigeon/api/proto/pigeon_queue.proto)."""

from __future__ import annotations

import grpc

from pigeon.api import errors
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


def _routed(method: str, fn, router):
    """A cluster node: a call about a subscription whose bundle another node owns goes to that node (every
    request of this service names its subscription)."""
    if router is None:
        return fn

    async def handler(req, context):
        if type(req) is not errors.Unparsable:  # (answered by `fn` as any other bad request)
            try:
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
        name: errors.unary(_routed(name, fn, router), req_type) for name, (fn, req_type) in methods.items()})]
