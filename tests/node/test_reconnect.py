"""A channel to a peer (another node, an etcd member) dials it again soon after it comes back. gRPC's own backoff
grows after each failed attempt (1 s, 1.6 s, 2.6 s, … up to two minutes) and a channel waiting out its backoff
fails every call at once: a node back after ten seconds down stayed unreachable through its peers for seconds more
— publishes to its bundles refused through every other node (a random-fault run: 15 s from a kill to the first
publish through a survivor)."""

from __future__ import annotations

import asyncio
import time

import grpc

from pigeon.bench.procs import free_port
from pigeon.core import limits
from pigeon.ops import tls

_METHOD = "/test.Echo/Echo"


async def _server(port: int) -> grpc.aio.Server:
    async def echo(request: bytes, context) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler("test.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo, request_deserializer=None, response_serializer=None)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def _answers(call) -> bool:
    try:
        return await call(b"ping", timeout=1.0) == b"ping"
    except grpc.aio.AioRpcError:
        return False


def test_a_peer_back_after_an_outage_is_reached_again_within_the_reconnect_bound():
    async def go() -> float:
        port = free_port()
        server = await _server(port)
        channel = tls.peer_channel(None, f"127.0.0.1:{port}", [])
        call = channel.unary_unary(_METHOD, request_serializer=None, response_deserializer=None)
        try:
            assert await _answers(call)
            await server.stop(None)
            down_until = time.monotonic() + 10.0  # long enough for gRPC's default backoff to reach several seconds
            while time.monotonic() < down_until:
                assert not await _answers(call)
                await asyncio.sleep(0.2)
            server = await _server(port)
            back = time.monotonic()
            while not await _answers(call):
                assert time.monotonic() - back < 10.0, "the peer was not reached again within 10 s"
                await asyncio.sleep(0.05)
            return time.monotonic() - back
        finally:
            await channel.close()
            await server.stop(None)

    took = asyncio.run(go())
    # the default backoff would leave the next attempt 4.6–7 s after the server came back
    assert took < limits.reconnect_s_max + 2.0, f"reached again only {took:.1f} s after the peer came back"
