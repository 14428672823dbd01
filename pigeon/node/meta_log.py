"""The cluster's metadata log (docs/cluster.md, "Metadata"): the metadata records — topics, subscriptions,
snapshots, schemas, policies — as one log in etcd that every node applies in the same order, so every node holds
the same metadata and any node can take an admin call. Owns the rules:

  * entry n is the key `log/meta/<n>`; an append at offset n is one transaction that requires the key n to be
    absent, so offsets are dense, taken once, and in revision order — etcd's quorum makes them durable;
  * a node validates a change against its state at its own end n and appends it at n: the append succeeds only
    if nobody appended at n meanwhile, so every entry was validated against exactly the state every node has
    when it applies it (a conflict answers UNAVAILABLE: the client retries against the newer state);
  * the node's journal keeps a copy of the log (its metadata log, offsets equal): on restart the node applies
    what its copy lacks from etcd, and a data directory whose copy holds entries etcd does not is refused;
  * an entry is applied once on every node: by its writer right after its transaction, by the others as the
    watch (or a catch-up read) brings it — both under one lock, each only at the node's end."""

from __future__ import annotations

import asyncio
import logging
import struct

from pigeon.cluster import metadata as M
from pigeon.core.bundles import META_LOG
from pigeon.core.errors import Unavailable
from pigeon.storage import records as R

log = logging.getLogger("pigeon.metalog")

PREFIX = f"{M.ROOT}/log/meta/"
_TYPE = struct.Struct("<I")
CONFLICT = "Another node changed the cluster's metadata at the same moment; retry."


def entry_key(offset: int) -> str:
    return f"{PREFIX}{offset:016d}"


def offset_of(key: str) -> int:
    return int(key[len(PREFIX):])


def encode(rec: R.Record) -> bytes:
    return _TYPE.pack(rec.TYPE) + b"".join(rec.parts())


def decode(value: bytes) -> R.Record:
    (rtype,) = _TYPE.unpack_from(value)
    return R.decode(rtype, memoryview(value)[_TYPE.size:])


class Diverged(Exception):
    """This node's copy of the metadata log holds entries the cluster's does not."""


class MetaLog:
    def __init__(self, meta, engine):
        self.meta, self.engine = meta, engine
        self.lock = asyncio.Lock()
        self._follower: asyncio.Task | None = None
        self.applied_remote = 0  # entries other nodes wrote, applied here

    def end(self) -> int:
        """The offset of the next entry: how many this node has applied."""
        return self.engine.journal.log(META_LOG).end()

    # --- starting ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Apply what this node lacks, then follow the log (returns once caught up)."""
        rev = await self.meta.revision()
        entries = await self.meta.list(PREFIX)
        if self.end() > len(entries):
            raise Diverged(f"this data directory's metadata log holds {self.end()} entries and the cluster's "
                           f"{len(entries)}: it is not a copy of this cluster's (was etcd's data lost?)")
        await self._apply_from(entries)
        log.info("metadata log: %d entries, %d topics, %d subscriptions", self.end(), len(self.engine.state.topics),
                 len(self.engine.state.subs))
        self._follower = asyncio.create_task(self._follow(rev), name="pigeon-metalog")

    async def stop(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)

    # --- writing -------------------------------------------------------------------------------------------
    async def commit(self, recs) -> None:
        """Append the metadata records of `recs` at this node's end (the state they were validated against: call
        with no await between validating and calling), then commit all of `recs` locally, in order."""
        at = self.end()
        metas = [r for r in recs if r.META]
        async with self.lock:
            if self.end() != at:
                raise Unavailable(CONFLICT)
            ok, _ = await self.meta.txn([M.absent(entry_key(at))],
                                        [M.Put(entry_key(at + i), encode(r)) for i, r in enumerate(metas)])
            if not ok:
                raise Unavailable(CONFLICT)
            for rec in recs:  # no await from the transaction to here: nothing else is applied in between
                self.engine.commit(rec)

    # --- following -----------------------------------------------------------------------------------------
    async def catch_up(self) -> None:
        """Apply every entry etcd holds beyond this node's end (a linearizable read: after it, this node has seen
        every change acknowledged before it was called)."""
        await self._apply_from([kv for kv in await self.meta.list(PREFIX) if offset_of(kv.key) >= self.end()])

    async def _apply_from(self, kvs) -> None:
        async with self.lock:
            for kv in kvs:
                n = offset_of(kv.key)
                if n == self.end():
                    self._apply(decode(kv.value))

    def _apply(self, rec: R.Record) -> None:
        new_sub = isinstance(rec, R.SubPut) and rec.uid not in self.engine.state.subs_by_uid
        self.engine.commit(rec)
        self.applied_remote += 1
        if new_sub:  # inactivity is counted from when this node learnt of it
            self.engine.state.subs_by_uid[rec.uid].last_activity = self.engine.clock.now()

    async def _follow(self, rev: int) -> None:
        while True:
            try:
                async for ev in self.meta.watch(PREFIX, rev):
                    rev = ev.kv.mod_revision
                    if ev.kind != "put":
                        continue
                    n = offset_of(ev.kv.key)
                    if n > self.end():  # something was missed: read it
                        await self.catch_up()
                    elif n == self.end():
                        async with self.lock:
                            if n == self.end():
                                self._apply(decode(ev.kv.value))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 — watched again from where it stopped; nothing is skipped
                log.warning("following the metadata log stopped (%s); following again", e)
                await asyncio.sleep(1.0)
                try:  # (from the present, after reading what came meanwhile: a history compacted is not asked for)
                    now = await self.meta.revision()
                    await self.catch_up()
                    rev = now
                except Exception:  # noqa: BLE001
                    pass
