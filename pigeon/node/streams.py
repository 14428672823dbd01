"""Waiting and flow control on the event loop: Signal wakes waiters, Stream is one StreamingPull stream's
flow-control state (the lease "owner" told release(num) when a lease ends)."""

from __future__ import annotations

import asyncio
import time

from pigeon.broker.subscription import SubscriptionState


class WallClock:
    def now(self) -> float:
        return time.time()


class Signal:
    """Wakes every coroutine waiting on it (new messages, released leases, resets)."""

    __slots__ = ("_futs",)

    def __init__(self):
        self._futs: list[asyncio.Future] = []

    def notify(self) -> None:
        futs, self._futs = self._futs, []
        for f in futs:
            if not f.done():
                f.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until notified or `timeout` seconds pass, whichever comes first."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._futs.append(fut)
        timer = loop.call_later(timeout, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            try:
                self._futs.remove(fut)  # still listed after a timeout or a cancellation
            except ValueError:
                pass


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


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

    def release(self, num: int) -> None:
        self.held_bytes -= self.held.pop(num, 0)

    def room(self) -> int:
        if self.held_bytes >= self.max_bytes:
            return 0
        return max(0, self.max_messages - len(self.held))
