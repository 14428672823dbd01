"""An asyncio event loop on virtual time, for the cluster simulator: the node's real coroutines (the executor,
the ledger writers, recovery, placement, the metadata log) run on it unchanged, and time jumps to the next timer
the moment nothing is ready — a minute of a cluster's life passes in milliseconds, the same way every run.

There is no I/O: the simulated network, disks and metadata store are Python objects that schedule their answers
as timers. Nothing runs on another thread (`run_in_executor` runs the function at once, on the loop), so one
seed gives one order of events; with PYTHONHASHSEED fixed (sets of names iterate in hash order) a run replays
exactly. A loop with nothing ready and no timer left is stuck: `Stuck` says so instead of waiting for ever.

Its scheduling is its own, for speed (a seed runs some 30,000 callbacks; asyncio's general loop spent a quarter of
a run on itself): timers sit in a heap of (when, sequence, handle) tuples — compared in C, and timers due at the
same moment run in the order they were set — and an iteration never polls a selector, it only moves the clock.
What runs, and when, is what asyncio's `_run_once` would run: every callback ready at the start of an iteration,
then the timers due by the clock."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import selectors
from asyncio import events
from collections import deque

_new, _copy_context, _heappush = object.__new__, contextvars.copy_context, heapq.heappush
_CANCELLED_MIN = 100  # cancelled timers kept in the heap before a purge is considered (asyncio's own threshold)


class Stuck(RuntimeError):
    """Nothing is ready and no timer is set, yet the awaited work is not done: a deadlock in the simulated
    cluster (or a wait on something the simulation never delivers)."""


class _VirtualSelector(selectors.BaseSelector):
    """The selector the base loop is built on (it registers its self-pipe): it never reports I/O, and the loop
    never waits on it."""

    def __init__(self):
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj, events, data=None):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys[fd] = selectors.SelectorKey(fileobj, fd, events, data)
        return key

    def unregister(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def modify(self, fileobj, events, data=None):
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout=None):
        return []

    def close(self):
        self._keys.clear()

    def get_map(self):
        return self._keys


class _Soon(events.Handle):
    """asyncio's Handle without its debug checks (the loop never runs in debug mode)."""
    __slots__ = ()

    def __init__(self, callback, args, loop, context):
        self._context = contextvars.copy_context() if context is None else context
        self._loop, self._callback, self._args = loop, callback, args
        self._cancelled, self._repr, self._source_traceback = False, None, None

    def cancel(self):
        if not self._cancelled:
            self._cancelled, self._callback, self._args = True, None, None


class _Timer(events.TimerHandle):
    """asyncio's TimerHandle, scheduled in the loop's heap; a cancelled one is counted for the purge."""
    __slots__ = ()

    def __init__(self, when, callback, args, loop, context):
        self._context = contextvars.copy_context() if context is None else context
        self._loop, self._callback, self._args = loop, callback, args
        self._cancelled, self._repr, self._source_traceback = False, None, None
        self._when, self._scheduled = when, True

    def cancel(self):
        if not self._cancelled:
            if self._scheduled:
                self._loop._cancelled_timers += 1
            self._cancelled, self._callback, self._args = True, None, None


class SimLoop(asyncio.SelectorEventLoop):
    """`time()` is virtual (starts at `start`); it moves only when the loop would otherwise wait."""

    def __init__(self, start: float = 1_000.0):
        self._now = start
        self._timers: list[tuple[float, int, _Timer]] = []  # a heap: (when, sequence, handle)
        self._seq = 0
        self._cancelled_timers = 0  # cancelled while in the heap
        super().__init__(_VirtualSelector())
        # Called for every future and task (some 10,000 a seed), by asyncio's C futures too: callables without a
        # frame of their own — the same Future, and the debug mode the loop never runs in.
        self.create_future = functools.partial(asyncio.Future, loop=self)
        self.get_debug = False.__bool__

    def set_debug(self, enabled: bool) -> None:
        if enabled:
            raise RuntimeError("the simulated loop has no debug mode")
        self._debug = False

    def time(self) -> float:
        return self._now

    def create_task(self, coro, *, name=None, context=None):
        """BaseEventLoop.create_task with the task factory called directly (a seed makes some 2,500 tasks)."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        factory = self._task_factory
        if factory is None:
            return super().create_task(coro, name=name, context=context)
        task = factory(self, coro, context)
        if name is not None:
            task.set_name(name)
        return task

    def call_soon(self, callback, *args, context=None):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        # (_Soon(callback, args, self, context), its fields set here: without the frame of __init__ — every
        # future's callback and every step of a task comes here)
        handle = _new(_Soon)
        handle._context = _copy_context() if context is None else context
        handle._loop, handle._callback, handle._args = self, callback, args
        handle._cancelled, handle._repr, handle._source_traceback = False, None, None
        self._ready.append(handle)
        return handle

    def call_at(self, when, callback, *args, context=None):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = _Timer(when, callback, args, self, context)
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, timer))
        return timer

    def call_later(self, delay, callback, *args, context=None):
        if self._closed:
            raise RuntimeError("Event loop is closed")
        when = self._now + delay
        timer = _new(_Timer)  # (_Timer(when, callback, args, self, context), as call_soon's handle)
        timer._context = _copy_context() if context is None else context
        timer._loop, timer._callback, timer._args = self, callback, args
        timer._cancelled, timer._repr, timer._source_traceback = False, None, None
        timer._when, timer._scheduled = when, True
        self._seq += 1
        _heappush(self._timers, (when, self._seq, timer))
        return timer

    def _run_once(self):
        """asyncio's iterations on virtual time, until the loop is stopped (run_forever calls this once; its own
        loop would make a call and a check per iteration, some 16,000 a seed): with nothing ready, the clock jumps
        to the first timer; then every callback ready, and every timer due, runs."""
        ready, heappop = self._ready, heapq.heappop
        while True:
            timers = self._timers
            if self._cancelled_timers > _CANCELLED_MIN and 2 * self._cancelled_timers > len(timers):
                live = []
                for entry in timers:
                    if entry[2]._cancelled:
                        entry[2]._scheduled = False
                    else:
                        live.append(entry)
                heapq.heapify(live)
                self._timers = timers = live
                self._cancelled_timers = 0
            if not ready and not self._stopping:
                while timers and timers[0][2]._cancelled:
                    heappop(timers)[2]._scheduled = False
                    self._cancelled_timers -= 1
                if not timers:
                    raise Stuck("nothing is ready and no timer is set")
                if timers[0][0] > self._now:
                    self._now = timers[0][0]
            now = self._now
            while timers and timers[0][0] <= now:
                timer = heappop(timers)[2]
                timer._scheduled = False
                if timer._cancelled:
                    self._cancelled_timers -= 1
                else:
                    ready.append(timer)
            for _ in range(len(ready)):
                handle = ready.popleft()
                if handle._cancelled:
                    continue
                try:  # (Handle._run, without its frame)
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:  # noqa: BLE001 — to the loop's exception handler, as Handle._run does
                    self.call_exception_handler({"message": f"Exception in callback {handle._callback!r}",
                                                 "exception": exc, "handle": handle})
            if self._stopping:
                return

    def run_in_executor(self, executor, func, *args):
        fut = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as e:  # noqa: BLE001 — handed to whoever awaits it, as an executor would
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        super().close()
        self._timers.clear()


def sleep(seconds: float) -> asyncio.Future:
    """`await sleep(s)` is `await asyncio.sleep(s)` for the simulated network and disks, which sleep at every
    message: a future the loop's timer completes, without asyncio.sleep's coroutine and its cancelling of the
    timer when the waiter goes (the timer then completes a future already done: nothing)."""
    loop = asyncio.get_running_loop()
    fut = asyncio.Future(loop=loop)  # (loop.create_future, without its frame)
    if loop._closed:
        raise RuntimeError("Event loop is closed")
    when = loop._now + seconds  # (loop.call_later(seconds, _wake, fut), without its frame)
    timer = _new(_Timer)
    timer._context = _copy_context()
    timer._loop, timer._callback, timer._args = loop, _wake, (fut,)
    timer._cancelled, timer._repr, timer._source_traceback = False, None, None
    timer._when, timer._scheduled = when, True
    loop._seq += 1
    _heappush(loop._timers, (when, loop._seq, timer))
    return fut


async def nap(seconds: float, done, look: float) -> None:
    """Sleep `seconds`, or less once `done()` holds (asked every `look` seconds meanwhile): a pause past the moment
    a simulated client waits for is virtual time the whole cluster lives through, at the cost of its timers."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while (left := until - loop.time()) > 0 and not done():
        await sleep(min(left, look))


def fingerprint() -> tuple[int, float]:
    """The running loop's timers set so far and its virtual time: two runs that differ in any event's order or
    time differ here, as good as always (a seed's replay is checked with it)."""
    loop = asyncio.get_running_loop()
    return loop._seq, loop._now


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def run(main, start: float = 1_000.0):
    """Run coroutine `main` to completion on a fresh SimLoop; its result (or its exception)."""
    loop = SimLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()

        async def settle():
            await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            try:
                loop.run_until_complete(settle())
            except Stuck:
                pass
        loop.close()


class deadline:
    """`async with deadline(s)` is `async with asyncio.timeout(s)` for the simulated network and clients, which
    set one at every call: the task is cancelled once `s` passes and the block raises TimeoutError (a cancel from
    elsewhere stays a cancel) — one timer, without asyncio.Timeout's states and rescheduling."""
    __slots__ = ("_delay", "_task", "_timer", "_fired", "_cancelling")

    def __init__(self, seconds: float):
        self._delay = seconds

    async def __aenter__(self) -> "deadline":
        task = self._task = asyncio.current_task()
        self._cancelling, self._fired = task.cancelling(), False
        self._timer = task.get_loop().call_later(self._delay, self._fire)
        return self

    def _fire(self) -> None:
        self._fired = True
        self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._timer.cancel()
        if self._fired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


class Channel:
    """asyncio.Queue's `put_nowait` and `get` for one reader, without its count of unfinished items and the Event
    behind it: the simulated streams pass every message through two. Items come out in order; a reader woken by
    a put resumes on the loop's next iteration, as a Queue's does."""
    __slots__ = ("_items", "_waiter")

    def __init__(self):
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self):
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()
