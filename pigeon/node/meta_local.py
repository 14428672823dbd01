"""The embedded metadata store: the metadata interface (pigeon.cluster.metadata) for one node without etcd, kept
in memory and, when given a path, in a file of its data directory (written whole: temporary file, fsync, rename).
Keys under a lease are a session's and are not written to the file. It keeps every rule of the contract, as etcd
does; the contract suite runs against both."""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import math
import os
import time
from collections import deque
from typing import AsyncIterator

from pigeon.core import limits
from pigeon.cluster.metadata import KV, Cmp, Delete, Event, LeaseGone, Op, Put, compare


class LocalMetadata:
    def __init__(self, path: str | None = None, clock=time.monotonic):
        self.path, self.clock = path, clock
        self.rev = 0
        self.kvs: dict[str, KV] = {}
        self._sorted: list[str] = []  # the keys of `kvs` in order (a list reads a range of it)
        self.leases: dict[int, tuple[int, float]] = {}  # id → (ttl, deadline)
        self._soonest = math.inf  # no lease ends before this (every call looks; most find nothing to end)
        self._next_lease = 1
        self.history: list[Event] = []
        self._compacted = 0  # the revision history was compacted to (a watch must start at or after it)
        self.watchers: list[tuple[str, _Events]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._held = False  # no lease runs out (a simulated store that is down: see hold)
        if path and os.path.exists(path):
            with open(path) as f:
                doc = json.load(f)
            self.rev = doc["revision"]
            for k, (v, c, m) in doc["keys"].items():
                self.kvs[k] = KV(k, base64.b64decode(v), c, m)
            self._sorted = sorted(self.kvs)

    # --- reading -------------------------------------------------------------------------------------------
    async def get(self, key: str) -> KV | None:
        self._expire()
        return self.kvs.get(key)

    async def list(self, prefix: str) -> list[KV]:
        self._expire()
        keys, out = self._sorted, []
        for i in range(bisect.bisect_left(keys, prefix), len(keys)):
            if not keys[i].startswith(prefix):
                break
            out.append(self.kvs[keys[i]])
        return out

    async def revision(self) -> int:
        self._expire()
        return self.rev

    async def compact(self, revision: int) -> None:
        self.history = [e for e in self.history if e.kv.mod_revision >= revision]
        self._compacted = max(self._compacted, revision)

    # --- changing ------------------------------------------------------------------------------------------
    async def txn(self, compares: list[Cmp], success: list[Op], failure: list[Op] = ()) -> tuple[bool, int]:
        self._expire()
        ok = all(compare(c, self.kvs.get(c.key)) for c in compares)
        self._apply(success if ok else failure)
        return ok, self.rev

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._expire()
        self._apply([Put(key, value, lease)])
        return self.rev

    async def delete(self, key: str) -> bool:
        self._expire()
        had = key in self.kvs
        self._apply([Delete(key)])
        return had

    def _apply(self, ops) -> None:
        """One revision for all of `ops` (if any changes something), as an etcd transaction."""
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in self.leases:
                raise LeaseGone(f"lease {op.lease} has ended")
        rev = self.rev + 1
        events = []
        for op in ops:
            if isinstance(op, Put):
                old = self.kvs.get(op.key)
                kv = KV(op.key, bytes(op.value), old.create_revision if old else rev, rev, op.lease)
                self.kvs[op.key] = kv
                if old is None:
                    bisect.insort(self._sorted, op.key)
                events.append(Event("put", kv))
            elif op.key in self.kvs:
                del self.kvs[op.key]
                del self._sorted[bisect.bisect_left(self._sorted, op.key)]
                events.append(Event("delete", KV(op.key, b"", 0, rev)))
        if not events:
            return
        self.rev = rev
        self._publish(events)
        if self.path and any(e.kind == "delete" or not e.kv.lease for e in events):
            self._save()

    def _publish(self, events: list[Event]) -> None:
        self.history.extend(events)
        del self.history[:-limits.metadata_watch_history_max]
        for prefix, q in self.watchers:
            for e in events:
                if e.kv.key.startswith(prefix):
                    q.put_nowait(e)

    def _save(self) -> None:
        doc = {"revision": self.rev, "keys": {k: (base64.b64encode(kv.value).decode(), kv.create_revision,
                                                  kv.mod_revision) for k, kv in self.kvs.items() if not kv.lease}}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- leases --------------------------------------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        self._expire()
        lease = self._next_lease
        self._next_lease += 1
        self.leases[lease] = (ttl_s, self.clock() + ttl_s)
        self._soonest = min(self._soonest, self.leases[lease][1])
        self._arm()
        return lease

    async def keepalive(self, lease: int) -> None:
        self._expire()
        if lease not in self.leases:
            raise LeaseGone(f"lease {lease} has ended")
        ttl = self.leases[lease][0]
        self.leases[lease] = (ttl, self.clock() + ttl)

    async def revoke(self, lease: int) -> None:
        self._expire()
        self._end(lease)

    def _end(self, lease: int) -> None:
        if self.leases.pop(lease, None) is not None:
            self._apply([Delete(k) for k, kv in sorted(self.kvs.items()) if kv.lease == lease])

    def hold(self, held: bool) -> None:
        """While held, no lease runs out; let go, every lease starts its time to live again — what etcd does
        across an outage of all its members (a new leader renews every lease). The cluster simulator's store
        outages; a node's own embedded store is never held."""
        self._held = held
        if not held:
            now = self.clock()
            self.leases = {lease: (ttl, now + ttl) for lease, (ttl, _) in self.leases.items()}
            self._soonest = min((d for _, d in self.leases.values()), default=math.inf)
            self._arm()

    def _expire(self) -> None:
        if self._held:
            return
        now = self.clock()
        if now < self._soonest:  # (a keepalive only moves a deadline later: the bound still holds)
            return
        for lease in [lease for lease, (_, deadline) in self.leases.items() if deadline <= now]:
            self._end(lease)
        self._soonest = min((d for _, d in self.leases.values()), default=math.inf)

    def _arm(self) -> None:
        """Expire leases on time even when nobody calls in (a watcher must see their keys go)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.leases and not self._held:  # (held: nothing expires; `hold(False)` arms again)
            wait = max(0.0, min(d for _, d in self.leases.values()) - self.clock())
            self._timer = loop.call_later(wait + 0.01, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._expire()
        self._arm()

    # --- watching ------------------------------------------------------------------------------------------
    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Event]:
        q = _Events()
        if (self.history and start_revision < self.history[0].kv.mod_revision - 1) or \
                start_revision + 1 < self._compacted:
            raise ValueError(f"revision {start_revision} is older than the history kept")
        for e in self.history:
            if e.kv.mod_revision > start_revision and e.kv.key.startswith(prefix):
                q.put_nowait(e)
        entry = (prefix, q)
        self.watchers.append(entry)
        try:
            while True:
                yield await q.get()
        finally:
            self.watchers.remove(entry)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Events:
    """A watch's queue of events: asyncio.Queue's put_nowait and get for its one reader (the watch), without the
    count of unfinished items and the Event behind it, nor the getters' list — every change goes through one per
    watcher. A reader woken by a put resumes on the loop's next iteration, as a Queue's does."""
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
