"""The benchmark's load, in forked worker processes. Owns the rule: workers start together at one instant
(`Gate`) and stop at a deadline or a count; the orchestrating process never opens a network connection itself, so
forking is safe with gRPC. An open loop sends each call at its instant, never before it (`Alarm`).
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import os
import queue
import time
import traceback
from typing import Callable

OPEN_LOOP_SETTLE_S = 30.0  # an open loop's publishes may still be answered this long after its gate's end


class Gate:
    """Shared by the workers of one run: they report ready, start together, stop at `until` or `limit` messages.

    `claim(n)` reserves n messages of the limit before a worker sends them, so a count-bounded run sends
    exactly `limit`; `add(n)` counts what was done (acknowledged or received) for progress and stop checks."""

    def __init__(self, ctx, duration_s: float, limit: int = 0):
        self.duration_s = duration_s
        self.limit = limit
        self._start_at = ctx.Value("d", 0.0)
        self._ready = ctx.Value("i", 0)
        self._claimed = ctx.Value("q", 0)
        self._done = ctx.Value("q", 0)

    async def wait_start(self) -> None:
        with self._ready.get_lock():
            self._ready.value += 1
        while self._start_at.value == 0.0:
            await asyncio.sleep(0.002)
        await asyncio.sleep(max(0.0, self._start_at.value - time.monotonic()))

    def open(self, lead_s: float = 0.05) -> float:
        self._start_at.value = time.monotonic() + lead_s
        return self._start_at.value

    @property
    def ready(self) -> int:
        return self._ready.value

    @property
    def start_at(self) -> float:
        return self._start_at.value

    @property
    def until(self) -> float:
        return self._start_at.value + self.duration_s

    def claim(self, n: int) -> bool:
        if time.monotonic() >= self.until:
            return False
        if not self.limit:
            return True
        with self._claimed.get_lock():
            if self._claimed.value + n > self.limit:
                return False
            self._claimed.value += n
            return True

    def add(self, n: int) -> None:
        with self._done.get_lock():
            self._done.value += n

    @property
    def done(self) -> int:
        return self._done.value

    def finished(self) -> bool:
        return time.monotonic() >= self.until or (self.limit > 0 and self._done.value >= self.limit)


def _run_loop(coro) -> object:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


def _worker_main(i, fn, args, out) -> None:
    try:
        out.put((i, "ok", _run_loop(fn(*args))))
    except BaseException as e:  # report, never hang the parent
        out.put((i, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"))


class Background:
    """One job (an async function and its args) in a forked process while the caller does other work."""

    def __init__(self, fn: Callable, args: tuple):
        ctx = mp.get_context("fork")
        self._out = ctx.Queue()
        self._proc = ctx.Process(target=_worker_main, args=(0, fn, args, self._out), daemon=True)
        self._proc.start()

    def alive(self) -> bool:
        return self._proc.is_alive()

    def result(self, wall_s: float):
        """Its result, once it ends within `wall_s` (else it is killed and TimeoutError raised)."""
        try:
            _, status, value = self._out.get(timeout=wall_s)
        except queue.Empty:
            raise TimeoutError(f"a background worker still running after {wall_s:.0f} s") from None
        finally:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        if status == "error":
            raise RuntimeError(f"background worker failed: {value}")
        return value


def run_workers(jobs: list[tuple[Callable, tuple]], gate: Gate | None, wall_s: float,
                tick: Callable[[], None] = lambda: None) -> list:
    """Fork one process per job (an async function and its args), open the gate once all are ready (every job
    of a gated run calls `gate.wait_start()` once), and
    return their results in order. Any worker error or the wall bound raises, after every worker is ended."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(i, fn, args, out), daemon=True)
             for i, (fn, args) in enumerate(jobs)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    deadline = time.monotonic() + wall_s
    try:
        while len(results) < len(procs):
            if gate is not None and gate.start_at == 0.0 and gate.ready >= len(procs):
                gate.open()
            try:
                i, status, value = out.get(timeout=0.1)
            except queue.Empty:
                tick()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workers still running after {wall_s:.0f} s")
                dead = [p for j, p in enumerate(procs) if j not in results and p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a worker died with exit code {dead[0].exitcode}")
                continue
            if status == "error":
                raise RuntimeError(f"worker {i} failed: {value}")
            results[i] = value
        tick()
        return [results[i] for i in range(len(procs))]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)


def run_one(fn: Callable, *args, wall_s: float = 120.0):
    """Run one async job in a forked process (setup, probes): the parent never opens a connection."""
    return run_workers([(fn, args)], None, wall_s)[0]


class _TimeSpec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("interval", _TimeSpec), ("value", _TimeSpec)]


_CLOCK_MONOTONIC, _TFD_TIMER_ABSTIME, _TFD_NONBLOCK, _TFD_CLOEXEC = 1, 1, 0o4000, 0o2000000


class Alarm:
    """Wakes a coroutine at an instant of `time.monotonic()` to within tens of microseconds, never before it: a
    timerfd (Linux) that the event loop watches. The loops' own timers work in whole milliseconds (uvloop's clock
    is libuv's, in ms): an open-loop sender pacing 1,000 sends a second with `asyncio.sleep` sent them from 0.4 ms
    early to 0.6 ms late, and a send stamped with its due time that leaves early reads as latency that was never
    there (one that leaves late, as latency the server did not add). Without a timerfd it falls back to sleep."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._fut: asyncio.Future | None = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._settime = libc.timerfd_settime
            self._fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (OSError, AttributeError):
            self._fd = -1
        if self._fd >= 0:
            self._loop.add_reader(self._fd, self._rang)

    async def at(self, when: float) -> None:
        if self._fd < 0:
            await asyncio.sleep(max(0.0, when - time.monotonic()))
            return
        sec = int(when)
        spec = _ITimerSpec(_TimeSpec(0, 0), _TimeSpec(sec, max(1, int((when - sec) * 1e9))))
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")
        self._fut = self._loop.create_future()
        await self._fut

    def _rang(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


async def open_loop(send, rate: int, gate, settle_s: float = OPEN_LOOP_SETTLE_S) -> dict:
    """Call `send(due)` at `rate` per second from the gate's start to its end without waiting for answers, each
    at its instant or after it (`Alarm`); returns how many were sent, how late the sender was and the
    acknowledgement times. A send that fails is
    counted (`failed`, and by reason in `failed_why`), not raised: one failure must not end the run and cancel
    every call still out (a slow server's run then reported nothing). What has no answer `settle_s` after the gate's end is counted
    (`unanswered`) and cancelled."""
    tasks: set = set()
    acks: list[float] = []
    lag: list[float] = []
    why: dict[str, int] = {}  # a failed send's reason (a gRPC status code's name, else the exception's type)
    closing = False

    def done(f: asyncio.Future) -> None:
        tasks.discard(f)
        if f.cancelled():
            if not closing:
                why["CANCELLED"] = why.get("CANCELLED", 0) + 1
        elif (e := f.exception()) is not None:
            code = e.code() if callable(getattr(e, "code", None)) else None
            reason = getattr(code, "name", type(e).__name__)
            why[reason] = why.get(reason, 0) + 1
        else:
            acks.append(f.result())

    await gate.wait_start()
    t0, i = gate.start_at, 0
    alarm = Alarm()
    try:
        while True:
            due = t0 + i / rate
            if due >= gate.until:
                break
            if due > time.monotonic():
                await alarm.at(due)
            lag.append(time.monotonic() - due)
            t = asyncio.ensure_future(send(due))
            tasks.add(t)
            t.add_done_callback(done)
            i += 1
    finally:
        alarm.close()
    if tasks:
        await asyncio.wait(set(tasks), timeout=settle_s)
    unanswered, closing = len(tasks), True
    late = list(tasks)
    for t in late:
        t.cancel()
    if late:
        await asyncio.wait(late)
    lag.sort()
    acks.sort()
    return {"sent": i, "failed": sum(why.values()), "failed_why": why, "unanswered": unanswered,
            "send_lag_p50_ms": round(lag[len(lag) // 2] * 1e3, 3) if lag else None,
            "send_lag_p99_ms": round(lag[int(len(lag) * 0.99)] * 1e3, 3) if lag else None,
            "ack_p50_ms": round(acks[len(acks) // 2] * 1e3, 3) if acks else None,
            "ack_p99_ms": round(acks[int(len(acks) * 0.99)] * 1e3, 3) if acks else None}
