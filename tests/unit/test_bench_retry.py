"""The benchmark's gRPC client sends a publish again where the official client would (a cluster refuses one with
UNAVAILABLE while the topic's shard moves), and only there: every other refusal is the benchmark's failure; the
report says what the latency figures leave out."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pigeon.bench.grpc_client import retried
from pigeon.bench.plan import PLANS
from pigeon.bench.report import latency_caveats, markdown


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



def test_the_report_says_what_the_latency_figures_leave_out():
    figures = {"sent": 20000, "received": 19978, "p50_ms": 18.1, "stream_errors": {"UNAVAILABLE": 2},
               "publish_retries": 3}
    assert latency_caveats("pigeon-cluster", figures) == [
        "pigeon-cluster / latency: 19,978 of 20,000 messages received within the run (the percentiles are of those)",
        "pigeon-cluster / latency: streams the server ended: UNAVAILABLE 2",
        "pigeon-cluster / latency: 3 publishes refused and sent again (their wait counted)"]
    assert latency_caveats("pigeon", {"sent": 10, "received": 10, "p50_ms": 1.0}) == []


def test_the_report_shows_each_latency_run_second_by_second():
    targets = {"pigeon": {"results": {"latency": {"p50_ms": 2.1, "p50_ms_each_second": [21.4, 2.3, 2.05]}}},
               "nats": {"results": {"latency": {"p50_ms": 0.4}}}}  # a result from before the field: no line
    doc = {"plan": "quick", "when": "2026-12-07T00:00:00+00:00",
           "settings": dict(PLANS["quick"].__dict__, message_bytes=1000),
           "machine": {"cores": 2, "cpu": "x", "memory_bytes": 2**34, "kernel": "6", "python": "3.11"},
           "targets": targets}
    text = markdown(doc)
    assert "## Latency second by second" in text and "* pigeon: 21.4 2.3 2.05\n" in text
    assert "* nats:" not in text
