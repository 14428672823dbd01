"""The latency workloads' open loop (pigeon.bench.workers.open_loop) on a slow or failing server: a failed send is
counted and the run goes on (one failure used to end the loop and cancel every call still out, and the run
reported nothing); what is still unanswered a while after the gate's end is counted and cancelled. And the course of
a latency run, second by second (pigeon.bench.workloads.medians_each_second)."""

from __future__ import annotations

import asyncio
import time

import uvloop

from pigeon.bench.workers import open_loop
from pigeon.bench.workloads import medians_each_second


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


def test_no_send_leaves_before_it_is_due():
    """Sends are stamped with the instant they were due: one that left early would read as latency that was never
    there. Under uvloop, as the benchmark's workers run, `asyncio.sleep` (libuv's millisecond timers) sent some
    of them up to 0.4 ms early; the open loop's timerfd alarm never fires before its instant."""
    early = []

    async def send(due: float) -> float:
        early.append(due - time.monotonic())
        return 0.0

    out = uvloop.run(open_loop(send, 1000, _Gate(0.3), settle_s=0.1))
    assert out["sent"] == len(early) >= 250
    assert max(early) <= 0, f"{sum(e > 0 for e in early)} sends left before they were due, by up to {max(early)} s"


def test_the_run_s_course_is_each_second_s_median():
    # a warm-up second at 40 ms, a steady one at 2 ms, a stall's queue draining, and a part second at the end
    lat_us = [40_000.0] * 10 + [2_000.0] * 10 + [float(30_000 - 3_000 * i) for i in range(10)] + [5_000.0] * 3
    assert medians_each_second(lat_us, rate=10) == [40.0, 2.0, 16.5, 5.0]
    assert medians_each_second([], rate=10) == []
