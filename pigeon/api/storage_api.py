"""The pigeon.v1.Storage gRPC surface (node to node): translation only, over the node's ledger store
(pigeon.node.ledger_store). Append is pipelined: every entry of the stream is handed to the store as it arrives
and answered, in order, once durable — so the entries in flight on a stream share group commits, and the
answers of requests made durable by one group commit go back as one (an answer covers every entry before its
index). Its requests are read in place (pigeon.node.append_wire), not parsed into messages; the pipeline is
pigeon.node.append_channel's, which also serves it without gRPC. ShardIn is the owner role's, beside: a pair
handed to a log this node owns (node.handover)."""

from __future__ import annotations

import grpc

from pigeon.api import errors
from pigeon.api.errors import translate
from pigeon.node.proto import pigeon_storage_pb2 as pb
from pigeon.core import limits
from pigeon.node.append_channel import serve_appends
from pigeon.node.ledger_store import LedgerStore
from pigeon.storage import records as R

SERVICE = "pigeon.v1.Storage"


class StorageApi:
    def __init__(self, store: LedgerStore, handovers=None):
        self.store = store
        self.handovers = handovers  # node.handover.HandOvers

    async def append(self, request_iterator, context):
        try:
            async for ledger, index, why in serve_appends(self.store, request_iterator, "grpc"):
                yield pb.AppendResponse(ledger=ledger, index=index, error=why).SerializeToString()
        except Exception as e:  # noqa: BLE001 — the boundary (api.errors); a request that did not parse
            await errors.abort(context, e)

    @translate
    async def fence(self, req, context):
        return pb.FenceResponse(held=await self.store.fence(req.ledger)).SerializeToString()

    @translate
    async def read(self, req, context):
        """The entries [start, end) that fit in limits.storage_message_bytes_max (one at least): the reader asks
        again from where the answer stops."""
        got = await self.store.read_warm(req.ledger, req.start, req.end, limits.storage_message_bytes_max)
        return pb.ReadResponse(entries=[e.body for e in got], types=[e.rtype for e in got]).SerializeToString()

    @translate
    async def delete(self, req, context):
        removed = await self.store.delete(list(req.ledgers))
        return pb.DeleteLedgersResponse(segments_removed=removed).SerializeToString()

    @translate
    async def shard_in(self, req, context):
        await self.handovers.accept(R.ShardOut.decode(req.shard_out))
        return pb.ShardInResponse().SerializeToString()


def handlers(store: LedgerStore, handovers=None) -> list[grpc.GenericRpcHandler]:
    api = StorageApi(store, handovers)
    return [grpc.method_handlers_generic_handler(SERVICE, {
        # requests are read by append_wire (views into the bytes as they came), not parsed into messages
        "Append": grpc.stream_stream_rpc_method_handler(api.append, request_deserializer=None,
                                                        response_serializer=None),
        "Fence": errors.unary(api.fence, pb.FenceRequest),
        "Read": errors.unary(api.read, pb.ReadRequest),
        "Delete": errors.unary(api.delete, pb.DeleteLedgersRequest),
        "ShardIn": errors.unary(api.shard_in, pb.ShardInRequest),
    })]
