"""The pigeon.v1.Storage gRPC surface (node to node): translation only, over the node's ledger store
(pigeon.node.ledger_store). Append is pipelined: every entry of the stream is handed to the store as it arrives
and answered, in order, once durable — so the entries in flight on a stream share group commits, and the
answers of requests made durable by one group commit go back as one (an answer covers every entry before its
index). Its requests are read in place (pigeon.node.append_wire), not parsed into messages."""

from __future__ import annotations

import asyncio

import grpc

from pigeon.api import errors
from pigeon.api.errors import translate
from pigeon.node.proto import pigeon_storage_pb2 as pb
from pigeon.core import limits
from pigeon.core.errors import InvalidArgument, PigeonError
from pigeon.node import append_wire
from pigeon.node.ledger_store import LedgerStore

SERVICE = "pigeon.v1.Storage"


_END = ("end",)  # the queue's end, once taken while merging answers


def _durable(done) -> bool:
    return done is not None and done.done() and not done.cancelled() and done.exception() is None


def _fitting(entries: list) -> list:
    size = 0
    for i, e in enumerate(entries):
        size += len(e.body)
        if i and size > limits.storage_message_bytes_max:
            return entries[:i]
    return entries


class StorageApi:
    def __init__(self, store: LedgerStore):
        self.store = store

    async def append(self, request_iterator, context):
        answers: asyncio.Queue = asyncio.Queue()

        async def take():
            try:
                async for raw in request_iterator:
                    try:
                        ledger, epoch, index, types, entries = append_wire.decode(raw)
                    except append_wire.Malformed as e:
                        raise InvalidArgument(f"The request is not a valid pigeon.v1.AppendRequest: {e}.") from None
                    try:
                        (last, done), why = self.store.submit_many(ledger, epoch, index, types, entries), ""
                    except PigeonError as e:  # entries before the refused one were taken; the writer rolls
                        last, done, why = index + len(entries) - 1, None, str(e)
                    answers.put_nowait((ledger, last, done, why))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(take())
        held = None  # an answer taken from the queue but not merged into the one before it
        try:
            while True:
                item, held = (held, None) if held is not None else (await answers.get(), None)
                if item is None:
                    break
                ledger, index, done, why = item
                if done is not None:
                    await done
                while not why:  # answers durable by now go in this message: an answer covers what is before it
                    try:
                        nxt = answers.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                    if nxt is None or nxt[0] != ledger or nxt[3] or not _durable(nxt[2]):
                        held = nxt if nxt is not None else _END
                        break
                    index = nxt[1]
                yield pb.AppendResponse(ledger=ledger, index=index, error=why).SerializeToString()
                if held is _END:
                    break
            await reader  # a request that did not parse ends the stream with its status
        except Exception as e:  # noqa: BLE001 — the boundary (api.errors)
            await errors.abort(context, e)
        finally:
            reader.cancel()

    @translate
    async def fence(self, req, context):
        return pb.FenceResponse(held=await self.store.fence(req.ledger)).SerializeToString()

    @translate
    async def read(self, req, context):
        """The entries [start, end) that fit in limits.storage_message_bytes_max (one at least): the reader asks
        again from where the answer stops."""
        got = _fitting(self.store.read(req.ledger, req.start, req.end))
        return pb.ReadResponse(entries=[e.body for e in got], types=[e.rtype for e in got]).SerializeToString()

    @translate
    async def delete(self, req, context):
        removed = await self.store.delete(list(req.ledgers))
        return pb.DeleteLedgersResponse(segments_removed=removed).SerializeToString()


def handlers(store: LedgerStore) -> list[grpc.GenericRpcHandler]:
    api = StorageApi(store)
    return [grpc.method_handlers_generic_handler(SERVICE, {
        # requests are read by append_wire (views into the bytes as they came), not parsed into messages
        "Append": grpc.stream_stream_rpc_method_handler(api.append, request_deserializer=None,
                                                        response_serializer=None),
        "Fence": errors.unary(api.fence, pb.FenceRequest),
        "Read": errors.unary(api.read, pb.ReadRequest),
        "Delete": errors.unary(api.delete, pb.DeleteLedgersRequest),
    })]
