"""The latency workloads' open loop (pigeon.bench.procs.open_loop) on a slow or failing server: a failed send is
counted and the run goes on (one failure used to end the loop and cancel every call still out, and the run
reported nothing); what is still unanswered a while after the gate's end is counted and cancelled."""

from __future__ import annotations

import asyncio
import time

from pigeon.bench.procs import open_loop


class _Gate:
    def __init__(self, duration_s: float):
        self.start_at = time.monotonic()
        self.until = self.start_at + duration_s

    async def wait_start(self) -> None:
        pass


def test_failures_and_unanswered_sends_are_counted_not_raised():
    calls = []

    async def send(due: float) -> float:
        n = len(calls)
        calls.append(due)
        if n % 5 == 4:
            raise RuntimeError("UNAVAILABLE")  # a failed publish
        if n == 7:
            await asyncio.Event().wait()  # never answered
        await asyncio.sleep(0.001)
        return time.monotonic() - due

    out = asyncio.run(open_loop(send, 200, _Gate(0.2), settle_s=0.1))
    assert out["sent"] == len(calls) >= 30
    assert out["failed"] == len(calls) // 5
    assert out["failed_why"] == {"RuntimeError": len(calls) // 5}  # by reason: a gRPC status's name, else the type
    assert out["unanswered"] == 1
    assert out["ack_p50_ms"] is not None and out["ack_p50_ms"] < 100
