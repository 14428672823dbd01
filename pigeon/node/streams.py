"""Waiting and flow control on the event loop: Signal wakes a subscription's waiters one at a time, Stream is one
StreamingPull stream's flow-control state (the lease "owner" told release(num) when a lease ends)."""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import time
from dataclasses import dataclass

from pigeon.broker.subscription import SubscriptionState


class WallClock:
    def now(self) -> float:
        return time.time()


class Signal:
    """Wakes the coroutines waiting for one subscription's messages (streams, pulls, a push worker).

    `notify()` wakes one waiter, the one that has waited longest; a waiter that takes messages and sees more
    ready passes the wake on, so a burst reaches as many waiters as it needs while an idle wake-up costs one
    coroutine switch however many streams wait (no thundering herd), and busy streams take turns.
    `notify_all()` is for what every waiter must see: configuration, seek, deletion, shutdown.
    `wake_at(t)` keeps one timer for the earliest time something becomes ready by itself (a lease running
    out, a backoff or an activation time ending): it wakes one waiter then."""

    __slots__ = ("_futs", "_stale", "_timer", "_timer_at")

    def __init__(self):
        self._futs: collections.deque[asyncio.Future] = collections.deque()
        self._stale = 0  # done futures still queued (timed out or cancelled waiters)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    @property
    def waiting(self) -> bool:
        """Some coroutine waits on this signal now."""
        return len(self._futs) > self._stale

    def notify(self) -> None:
        futs = self._futs
        while futs:
            f = futs.popleft()
            if not f.done():
                f.set_result(None)
                return
            self._stale -= 1

    def notify_all(self) -> None:
        futs, self._futs, self._stale = self._futs, collections.deque(), 0
        for f in futs:
            if not f.done():
                f.set_result(None)

    def wake_at(self, when: float) -> None:
        """Wake one waiter at loop time `when` (keeps the earliest of the times asked for)."""
        if when >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self.notify()

    async def wait(self, timeout: float, stream: "Stream | None" = None) -> None:
        """Until woken (by this signal, or by `stream`'s own events) or `timeout` seconds pass."""
        fut = asyncio.get_running_loop().create_future()
        self._futs.append(fut)
        try:
            await _until(fut, timeout, stream)
        except BaseException:  # cancelled right after being chosen: the wake goes to the next waiter
            if fut.done() and not fut.cancelled() and fut.result() is None:
                self.notify()
            raise
        finally:
            if fut.cancelled() or fut.result() is not None:  # left queued: timed out, cancelled or stream-woken
                self._stale += 1
                if self._stale > 16 and self._stale * 2 > len(self._futs):
                    self._futs = collections.deque(f for f in self._futs if not f.done())
                    self._stale = 0


async def _until(fut: asyncio.Future, timeout: float, stream: "Stream | None") -> None:
    timer = asyncio.get_running_loop().call_later(timeout, _resolve, fut, _TIMED_OUT)
    if stream is not None:
        stream.waiter = fut
    try:
        await fut
    finally:
        timer.cancel()
        if stream is not None:
            stream.waiter = None
        if not fut.done():
            fut.cancel()


_TIMED_OUT = "timeout"
_WOKEN = "stream"


def _resolve(fut: asyncio.Future, why=None) -> None:
    if not fut.done():
        fut.set_result(why)


class Gate:
    """What a cluster delivery waits for before its messages go out (node.delivery: `recording`): its parts — the
    Deliver record held by Qa members, each shard's publishers answered — and once all are in, `fut` is done and
    `wakes` are called in that same step. A part that is a future (the record's) is heard in its done callback;
    an answer (`answer_in`) in the call that gives it: the stream waiting on the delivery is then woken at once,
    where each future the news passed through (a shield, a gather, then the stream's wake-up as their callback)
    had cost a turn of the event loop, each as long as the busy owner's longest. A failed or cancelled part makes
    `fut` fail (or cancel) the same way."""

    __slots__ = ("fut", "left", "answers", "wakes", "on_answers")

    def __init__(self):
        self.fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.left = 1  # parts not in yet, and the arming (`arm`): nothing opens the gate while parts are added
        self.answers = 0  # of them, publishers' answers
        self.wakes: list = []
        self.on_answers = None  # called once every answer is in (hop timestamps)

    def wait_answer(self) -> None:
        self.left += 1
        self.answers += 1

    def answer_in(self) -> None:
        self.answers -= 1
        if not self.answers and self.on_answers is not None:
            self.on_answers()
        self._part_in()

    def wait_future(self, fut: asyncio.Future) -> None:
        self.left += 1
        fut.add_done_callback(self._future_in)

    def arm(self) -> None:
        """Every part is added: open the gate once they are in (now, if they are)."""
        self._part_in()

    def _future_in(self, fut: asyncio.Future) -> None:
        if self.fut.done():
            return
        if fut.cancelled():
            self.fut.cancel()
        elif fut.exception() is not None:
            self.fut.set_exception(fut.exception())
        else:
            self._part_in()
            return
        self._wake()

    def _part_in(self) -> None:
        self.left -= 1
        if not self.left and not self.fut.done():
            self.fut.set_result(None)
            self._wake()

    def _wake(self) -> None:
        for wake in self.wakes:
            wake()


@dataclass(frozen=True, slots=True)
class StreamStats:
    subscription: str
    client_id: str
    held: int  # messages leased to it and not yet acked or nacked
    held_bytes: int
    max_messages: int
    max_bytes: int
    delivered: int  # messages handed to it since it opened


class Stream:
    """One StreamingPull stream's flow control: what it holds and how much more it may take."""

    def __init__(self, sub: SubscriptionState, client_id: str, deadline_s: int, max_messages: int, max_bytes: int):
        self.sub = sub
        self.client_id = client_id
        self.deadline_s = deadline_s
        self.max_messages = max_messages if max_messages > 0 else 1 << 62
        self.max_bytes = max_bytes if max_bytes > 0 else 1 << 62
        self.held: dict[int, int] = {}  # message number → bytes
        self.held_bytes = 0
        self.error: Exception | None = None  # set by the request reader: ends the stream with it
        self.ended = False  # the client half-closed
        self.outbox: list[bytes] = []  # encoded responses to send before more messages (confirmations)
        # deliveries made, their leases on their way to the log's members (a cluster): each goes out once its
        # lease is recorded, while the next one is already being recorded
        self.unsent: collections.deque = collections.deque()  # (responses' entries, the recording's future,
        #                                                        when their leases run out)
        self.waiter: asyncio.Future | None = None  # set while the stream waits
        self.delivered = 0
        self.sending_since: float | None = None  # when the response gRPC is writing now was handed over
        self.sending_bytes = 0  # … and its size
        self.stall_noted = False  # logged as a client that left a response untaken (once)

    def resize(self, max_messages: int, max_bytes: int) -> None:
        """New flow-control limits (a merge's steering: api.spread); a limit not given (0) stays as it is."""
        if max_messages > 0:
            self.max_messages = max_messages
        if max_bytes > 0:
            self.max_bytes = max_bytes
        if self.waiter is not None and self.room() > 0:
            _resolve(self.waiter, _WOKEN)

    def wake(self, _=None) -> None:
        """Something for this stream alone: a response in its outbox, an error, the client's half-close, a
        delivery's lease recorded (a cluster: a future's done callback)."""
        if self.waiter is not None:
            _resolve(self.waiter, _WOKEN)

    def hold(self, nums, sizes: list[int]) -> None:
        """Messages handed to this stream (number, bytes): they count against its flow control until released."""
        self.held.update(zip(nums, sizes))
        self.held_bytes += sum(sizes)
        self.delivered += len(sizes)

    def release(self, num: int) -> None:
        self.release_all((num,))

    def release_all(self, nums) -> None:
        self.held_bytes -= sum(map(self.held.pop, nums, itertools.repeat(0)))
        if self.waiter is not None and self.room() > 0:
            _resolve(self.waiter, _WOKEN)

    async def wait(self, timeout: float) -> None:
        """Until this stream alone is woken (room freed by its acks, its outbox, its end) or `timeout` passes."""
        await _until(asyncio.get_running_loop().create_future(), timeout, self)

    def statistics(self) -> StreamStats:
        return StreamStats(self.sub.name, self.client_id, len(self.held), self.held_bytes, self.max_messages,
                           self.max_bytes, self.delivered)

    def room(self) -> int:
        if self.held_bytes >= self.max_bytes:
            return 0
        return max(0, self.max_messages - len(self.held))
