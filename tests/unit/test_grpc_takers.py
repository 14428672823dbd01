"""pigeon.api.takers against a real grpc.aio server on loopback: the hot methods' calls come through the extra
asks, handled by the same handlers (their statuses reach the client), the other methods as before, and the asks
end with the server."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pigeon.api import takers

PUBLISH = "/google.pubsub.v1.Publisher/Publish"
GET_TOPIC = "/google.pubsub.v1.Publisher/GetTopic"


def _handlers(inside: list, release: asyncio.Event):
    async def publish(request: bytes, context):
        if request == b"bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
        inside.append(request)
        await release.wait()
        return b"ok:" + request

    async def get_topic(request: bytes, context):
        return b"topic"

    return [grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", {
        "Publish": grpc.unary_unary_rpc_method_handler(publish),
        "GetTopic": grpc.unary_unary_rpc_method_handler(get_topic),
    })]


async def _serve(n: int, internals: bool = True):
    inside, release = [], asyncio.Event()
    server = grpc.aio.server()
    handlers = _handlers(inside, release)
    server.add_generic_rpc_handlers(handlers)
    taking = takers.Takers(server, n).register(handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    taking.start()
    return server, taking, port, inside, release


def test_hot_calls_come_through_the_extra_asks_and_keep_their_handlers_statuses():
    async def run():
        server, taking, port, inside, release = await _serve(4)
        assert set(taking.methods) == {PUBLISH}  # GetTopic is not hot: grpc.aio takes it as before
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                publish, get = ch.unary_unary(PUBLISH), ch.unary_unary(GET_TOPIC)
                calls = [asyncio.ensure_future(publish(str(i).encode(), timeout=30)) for i in range(40)]
                while len(inside) < 40:  # every call is in its handler at once, none answered yet
                    await asyncio.sleep(0.01)
                # each call taken here is served by the task that took it, another asking in its place
                assert len(taking.tasks) == 4 and len(taking._calls) == taking.taken > 0
                release.set()
                assert await asyncio.gather(*calls) == [b"ok:" + str(i).encode() for i in range(40)]
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await publish(b"bad", timeout=30)
                assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "bad request")
                assert await get(b"", timeout=30) == b"topic"
            return taking.taken
        finally:
            await server.stop(None)
            await taking.stop()

    taken = asyncio.run(run())
    assert taken > 0  # calls started by the extra asks (the rest by grpc.aio's own)


def test_the_asks_end_with_the_server():
    async def run():
        server, taking, port, _, release = await _serve(3)
        release.set()
        asks = list(taking.tasks)
        assert len(asks) == 3 and not any(t.done() for t in asks)
        await server.stop(None)
        for _ in range(100):  # gRPC fails the outstanding asks as it shuts down: each ask returns
            if all(t.done() for t in asks):
                break
            await asyncio.sleep(0.01)
        assert all(t.done() and not t.cancelled() and t.exception() is None for t in asks)
        await taking.stop()
        assert not taking.tasks

    asyncio.run(run())


def test_without_grpcs_internals_calls_are_taken_as_grpc_aio_takes_them(monkeypatch):
    monkeypatch.setattr(takers, "_INTERNALS", False)

    async def run():
        server, taking, port, _, release = await _serve(4)
        release.set()
        try:
            assert taking.methods == {} and not taking.tasks
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                assert await ch.unary_unary(PUBLISH)(b"x", timeout=30) == b"ok:x"
        finally:
            await server.stop(None)
            await taking.stop()

    asyncio.run(run())
