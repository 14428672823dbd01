"""The pigeon.v1.Storage gRPC surface (node to node): translation only, over the node's ledger store
(pigeon.node.ledger_store). Append is pipelined: every entry of the stream is handed to the store as it arrives
and answered, in order, once durable — so the entries in flight on a stream share group commits."""

from __future__ import annotations

import asyncio

import grpc

from pigeon.api import errors
from pigeon.api.errors import translate
from pigeon.node.proto import pigeon_storage_pb2 as pb
from pigeon.core.errors import PigeonError
from pigeon.node.ledger_store import LedgerStore

SERVICE = "pigeon.v1.Storage"


class StorageApi:
    def __init__(self, store: LedgerStore):
        self.store = store

    async def append(self, request_iterator, context):
        answers: asyncio.Queue = asyncio.Queue()

        async def take():
            try:
                async for req in request_iterator:
                    if type(req) is errors.Unparsable:
                        raise req.refused()
                    last, done, why = req.index, None, ""
                    try:
                        done = self.store.submit(req.ledger, req.epoch, req.index, req.type, req.entry)
                        for i, (rtype, entry) in enumerate(zip(req.more_types, req.more_entries), 1):
                            last = req.index + i
                            done = self.store.submit(req.ledger, req.epoch, last, rtype, entry)
                    except PigeonError as e:  # entries before `last` were taken; the writer rolls on an error
                        done, why = None, str(e)
                    answers.put_nowait((req.ledger, last, done, why))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(take())
        try:
            while (item := await answers.get()) is not None:
                ledger, index, done, why = item
                if done is not None:
                    await done
                yield pb.AppendResponse(ledger=ledger, index=index, error=why).SerializeToString()
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
        got = self.store.read(req.ledger, req.start, req.end)
        return pb.ReadResponse(entries=[e.body for e in got], types=[e.rtype for e in got]).SerializeToString()

    @translate
    async def delete(self, req, context):
        removed = await self.store.delete(list(req.ledgers))
        return pb.DeleteLedgersResponse(segments_removed=removed).SerializeToString()


def handlers(store: LedgerStore) -> list[grpc.GenericRpcHandler]:
    api = StorageApi(store)
    return [grpc.method_handlers_generic_handler(SERVICE, {
        "Append": grpc.stream_stream_rpc_method_handler(api.append, request_deserializer=errors.parser(
            pb.AppendRequest), response_serializer=None),
        "Fence": errors.unary(api.fence, pb.FenceRequest),
        "Read": errors.unary(api.read, pb.ReadRequest),
        "Delete": errors.unary(api.delete, pb.DeleteLedgersRequest),
    })]
