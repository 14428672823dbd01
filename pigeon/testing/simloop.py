"""An asyncio event loop on virtual time, for the cluster simulator: the node's real coroutines (the executor,
the ledger writers, recovery, placement, the metadata log) run on it unchanged, and time jumps to the next timer
the moment nothing is ready — a minute of a cluster's life passes in milliseconds, the same way every run.

There is no I/O: the simulated network, disks and metadata store are Python objects that schedule their answers
as timers. Nothing runs on another thread (`run_in_executor` runs the function at once, on the loop), so one
seed gives one order of events; with PYTHONHASHSEED fixed (sets of names iterate in hash order) a run replays
exactly. A loop with nothing ready and no timer left is stuck: `Stuck` says so instead of waiting for ever."""

from __future__ import annotations

import asyncio
import selectors


class Stuck(RuntimeError):
    """Nothing is ready and no timer is set, yet the awaited work is not done: a deadlock in the simulated
    cluster (or a wait on something the simulation never delivers)."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector that reports no I/O ever; waiting `timeout` seconds moves the virtual clock instead."""

    def __init__(self, loop: "SimLoop"):
        self._loop = loop
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
        if timeout is None:
            raise Stuck("nothing is ready and no timer is set")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def close(self):
        self._keys.clear()

    def get_map(self):
        return self._keys


class SimLoop(asyncio.SelectorEventLoop):
    """`time()` is virtual (starts at `start`); it moves only when the loop would otherwise wait."""

    def __init__(self, start: float = 1_000.0):
        self._now = start
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def run_in_executor(self, executor, func, *args):
        fut = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as e:  # noqa: BLE001 — handed to whoever awaits it, as an executor would
            fut.set_exception(e)
        return fut


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
