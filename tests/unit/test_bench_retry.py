"""The benchmark's gRPC client sends a publish again where the official client would (a cluster refuses one with
UNAVAILABLE while the topic's shard moves), and only there: every other refusal is the benchmark's failure."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pigeon.bench.grpc_client import retried


def _refusal(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="refused")


def test_a_publish_refused_while_its_shard_moves_is_sent_again_until_it_is_taken():
    codes = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED]
    sent: list[bytes] = []

    async def call(request, timeout):
        sent.append(request)
        if codes:
            raise _refusal(codes.pop(0))
        return b"ids"

    retries = [0]
    assert asyncio.run(retried(call, b"req", 30, retries)) == b"ids"
    assert sent == [b"req"] * 3 and retries == [2]


def test_a_refusal_the_official_client_does_not_retry_is_raised_at_once():
    async def call(request, timeout):
        raise _refusal(grpc.StatusCode.INVALID_ARGUMENT)

    retries = [0]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        asyncio.run(retried(call, b"req", 30, retries))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and retries == [0]
