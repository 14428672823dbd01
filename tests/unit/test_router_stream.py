"""A stream forwarded to an owner (api.router.Router.stream) against a real gRPC server on loopback: once the owner
ends it, nothing of it waits on: the requests meant for it are no longer read. (grpc.aio, given a request
iterator, reads it in a task of its own that a cancel ends only while the call is open: after an owner ended a
merge's stream — a shard moved — that task waited on the merge's queue for good, and asyncio reported it destroyed
pending when it was collected, then "aclose(): asynchronous generator is already running".)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from pigeon.api.errors import Relayed
from pigeon.api.router import Owner, Router

METHOD = "/google.pubsub.v1.Subscriber/StreamingPull"


class _Context:
    def invocation_metadata(self):
        return ()


def test_a_stream_its_owner_ended_stops_reading_the_requests_meant_for_it():
    async def go():
        asked: list[bytes] = []

        async def owner(requests, context):  # takes the head, answers once, then ends the stream as a move does
            asked.append(await requests.__anext__())
            yield b"one"
            await context.abort(grpc.StatusCode.UNAVAILABLE, "A shard of the topic is moving to another node.")

        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "google.pubsub.v1.Subscriber", {"StreamingPull": grpc.stream_stream_rpc_method_handler(owner)})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        router = Router(engine=SimpleNamespace(config=None),
                        cluster=SimpleNamespace(info=SimpleNamespace(node_id="n1")))
        q: asyncio.Queue = asyncio.Queue()
        read_until = []

        async def requests():  # the merge's: what the client sends later, for as long as it lasts
            try:
                while True:
                    yield await q.get()
            finally:
                read_until.append("closed")

        got = []
        try:
            with pytest.raises(Relayed) as ended:
                async for resp in router.stream(Owner(f"127.0.0.1:{port}", ()), METHOD, b"head", requests(),
                                                _Context(), watch=False):
                    got.append(resp)
            assert ended.value.code == grpc.StatusCode.UNAVAILABLE and got == [b"one"] and asked == [b"head"]
            for _ in range(50):
                if read_until:
                    break
                await asyncio.sleep(0.01)
            assert read_until == ["closed"], "the requests of an ended stream were still being waited for"
            writers = [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "").endswith(
                ("_consume_request_iterator", "stream.<locals>.up"))]  # (grpc.aio's, the router's)
            assert not writers, f"a task writing the ended stream's requests still waits: {writers}"
        finally:
            await router.close()
            await server.stop(None)

    asyncio.run(go())
