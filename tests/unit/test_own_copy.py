"""The owner's own copy of its own ledgers (pigeon.node.own_copy with node.ledger_store) over the simulated disk,
on virtual time (one seed, one run):
random lives of an owner — its records written to the node journal and lent to its ledgers, some sent only later
(held back), snapshots written whole among them, rolls that send a ledger's last entries again to the next one,
fences with recovery's whole copies after them, the replaced writer's records the store refuses, the log given up
(a Reset), positions checkpoints — each ended by a power cut (the unsynced tail lost, sometimes torn) or a clean
stop. After every restart: each entry answered is held and reads back as written, no entry reads
as other bytes, and no ledger claims an entry its writer did not mean for it (a record written after it was
fenced, or after its log was given up) — one written and not yet sent when the process died it may: the entry it
would have sent."""

from __future__ import annotations

import asyncio
import random

import pytest

from pigeon.core import limits
from pigeon.core.errors import FailedPrecondition
from pigeon.node import own_copy
from pigeon.node.ledger_store import FENCE_EPOCH, LedgerStore
from pigeon.storage import recovery
from pigeon.storage import records as R
from pigeon.testing.simdisk import SimDisk
from pigeon.testing import simloop
from pigeon.testing.simjournal import SimJournalWriter

DATA = "/data"


class _Nothing:
    def load(self, header, meta, images) -> None:
        pass

    def apply(self, rtype: int, body, at: int) -> None:
        pass


class _Host:
    """The machine as the store sees it: one simulated disk, journals written on the loop."""

    def __init__(self, disk: SimDisk):
        self.disk = self.cold_disk = disk

    def journal(self, directory: str, policy, segment_bytes: int, disk=None):
        return SimJournalWriter(directory, policy, 1 << 12, disk or self.disk, lambda: 0.0002)


def _body(ledger: int, index: int) -> bytes:
    return b"ledger %d entry %d " % (ledger, index) * (1 + (ledger * 7 + index) % 5)


class _Ledger:
    """What the test knows of an open ledger: its log, and its entries this life — (where, body, at): `where` None
    for one written whole, `at` where the node journal holds its record or its marker — to send again to the next
    ledger at a roll, from the first one not confirmed (by Qa members: some time after this store answered it)."""

    def __init__(self, log: int):
        self.log = log
        self.entries: list[tuple[tuple | None, bytes, int]] = []
        self.confirmed = 0


class _Life:
    """One life of the node: its journal and ledger store, and what the test knows of the ledgers."""

    def __init__(self, rng: random.Random, disk: SimDisk, model: dict):
        self.rng, self.disk, self.m = rng, disk, model
        self.open_: dict[int, _Ledger] = {}
        self.deferred: dict[int, list[tuple]] = {}  # ledger → (position, where, index) written, sent later

    async def open(self) -> None:
        for sub in ("wal", "checkpoints"):
            self.disk.makedirs(f"{DATA}/{sub}")
        found = recovery.recover(self.disk, DATA, _Nothing, repair=True)
        slow = self.rng.choice([0.0002, 0.002])  # (a node journal slower than the ledgers' leaves copies durable
        self.node = SimJournalWriter(f"{DATA}/wal", "always", 1 << 12, self.disk, lambda: slow)  # before it)
        self.node.open(found.tail, found.logs)
        self.store = LedgerStore(DATA, host=_Host(self.disk), node=self.node)
        self.store.unsent_from = self.unsent_from
        await self.store.open()
        self.check(opened=True)

    def unsent_from(self) -> int | None:
        """(node.bundle_logs.unsent_from) Where the first entry of an open ledger not yet confirmed lies."""
        return min((led.entries[led.confirmed][2] for led in self.open_.values() if led.confirmed < len(led.entries)),
                   default=None)

    def check(self, opened: bool = False) -> None:
        """Every entry answered is held, none is held its writer did not mean for it, and each reads back as
        written — after a restart every one held (all of it durable), before it at least every one answered."""
        s, m = self.store, self.m
        for lid, answered in m["answered"].items():
            held = s.held(lid)
            assert answered <= held <= m["meant"][lid], (lid, answered, held, m["meant"][lid])
            got = s.read(lid, 0, held)
            assert [e.body for e in got] == [m["body"][lid, i] for i in range(len(got))], lid
            assert len(got) == held if opened else len(got) >= answered, (lid, held, answered, len(got))

    def _record(self, log: int, rtype: int = 1, body: bytes = b"") -> tuple:
        offset, at = self.node.append(log, 1, rtype, [body])
        return log, offset, at, self.node.tail

    def _meant(self, lid: int, index: int, body: bytes) -> None:
        """The ledger's writer means entry `index` for it: written to the node journal for it, or taken whole."""
        m = self.m
        m["meant"][lid] = max(m["meant"].get(lid, 0), index + 1)
        m["answered"].setdefault(lid, 0)
        m["body"][lid, index] = body

    def _submit(self, lid: int, index: int, where: tuple | None, body: bytes, epoch: int = 1) -> None:
        fut = self.store.submit(lid, epoch, index, 1, body, now=self.rng.random() < 0.5, where=where)
        self._meant(lid, index, body)

        def done(f):
            if not f.cancelled() and f.exception() is None:
                self.m["answered"][lid] = max(self.m["answered"][lid], index + 1)
        fut.add_done_callback(done)

    def _add(self, lid: int, where: tuple | None, body: bytes, at: int | None = None) -> None:
        """The ledger's next entry: sent now, or held back behind the ones held back already (`at`: where the node
        journal holds its record, or its marker)."""
        led = self.open_[lid]
        index = len(led.entries)
        led.entries.append((where, body, at if where is None else where[2]))
        self.m["answered"].setdefault(lid, 0)
        if lid in self.deferred or (where is not None and self.rng.random() < 0.15):
            self._meant(lid, index, body)  # (a crash may come first: a rebuild may take it)
            self.deferred.setdefault(lid, []).append((where, index))
        else:
            self._submit(lid, index, where, body)

    def new_ledger(self, log: int | None = None, again: list | None = None) -> int:
        """A ledger of `log` (its first entry a snapshot at times), or one sent `again` a roll's entries."""
        m = self.m
        m["next_ledger"] += 1
        lid = m["next_ledger"]
        if log is None:
            busy = {led.log for led in self.open_.values()}  # (one ledger of a log open at a time: one writer)
            log = self.rng.choice([lg for lg in (10_000 + lid, 1000, 1001, 1002) if lg not in busy])
        self.open_[lid] = _Ledger(log)
        for where, body, at in again or ():
            self._add(lid, where, body, at)
        if not again:
            if self.rng.random() < 0.5:  # it starts with the log's snapshot: whole, and no record in the node journal
                self._add(lid, None, _body(lid, 0), self.node.mark(log))  # (node.bundle_logs notes where it went)
            self.append(lid)
        return lid

    def snapshot(self, lid: int) -> None:
        """The log's snapshot in the middle of a ledger: whole (a marker in the node journal says where it went among
        the log's records), and the lent entries go on after it."""
        led = self.open_[lid]
        self._add(lid, None, _body(lid, len(led.entries)), self.node.mark(led.log))

    def append(self, lid: int) -> None:
        led = self.open_[lid]
        led.confirmed = self.rng.randint(led.confirmed, max(led.confirmed, self.m["answered"].get(lid, 0)))
        body = _body(lid, len(led.entries))
        self._add(lid, self._record(led.log, body=body), body)

    def send_deferred(self, lid: int | None = None) -> None:
        for ledger in [lid] if lid is not None else list(self.deferred):
            for where, index in self.deferred.pop(ledger, ()):
                if ledger in self.open_:
                    self._submit(ledger, index, where, self.open_[ledger].entries[index][1])

    async def fence(self, lid: int, replaced: bool = True) -> int:
        """Recovery fences the ledger here: the replaced writer's records after it are refused, and recovery's
        whole copies taken."""
        self.send_deferred(lid)
        count = await self.store.fence(lid)
        self.m["answered"][lid] = max(self.m["answered"][lid], count)
        led = self.open_.pop(lid)
        for _ in range(self.rng.randrange(3) if replaced else 0):
            where = self._record(led.log, body=b"refused")
            with pytest.raises(FailedPrecondition):
                self.store.submit(lid, 1, count, 1, b"refused", where=where)
        for index in range(count, count + (self.rng.randrange(3) if replaced else 0)):
            self._submit(lid, index, None, _body(lid, index), FENCE_EPOCH)
        return count

    async def roll(self, lid: int) -> None:
        """The writer rolls: it closes its ledger (fenced here) and sends the entries it had not confirmed again,
        in order, to a new ledger of the log — whose first one is one of them: ledgers share those records."""
        led = self.open_[lid]
        await self.fence(lid, replaced=False)
        lent = [i for i, (where, _, _) in enumerate(led.entries) if where is not None and i >= led.confirmed]
        again = led.entries[self.rng.choice(lent):] if lent else []
        self.new_ledger(led.log, again)

    def give_up(self, lid: int) -> None:
        """The log given up: a Reset in the node journal, and more records of the log no ledger of before takes."""
        self.send_deferred(lid)
        led = self.open_.pop(lid)
        self._record(led.log, R.RecordType.RESET, b"reset")
        self._record(led.log, body=b"after the reset")

    async def step(self) -> None:
        rng, m = self.rng, self.m
        roll = rng.random()
        some = rng.choice(sorted(self.open_)) if self.open_ else None
        if some is None or roll < 0.05:
            self.new_ledger()
        elif roll < 0.78:
            self.append(some)
        elif roll < 0.81:
            await self.fence(some)
        elif roll < 0.84:
            await self.roll(some)
        elif roll < 0.86:
            self.give_up(some)
        elif roll < 0.88:
            self.send_deferred()
        elif roll < 0.9:
            self.snapshot(some)
        elif roll < 0.95:
            self._record(7, body=b"another log's record")  # (a log no ledger has)
        else:
            await asyncio.sleep(0.001 * rng.randrange(4))
            self.check()

    async def end(self, crash: bool) -> None:
        if crash:
            await asyncio.sleep(self.rng.choice([0, 0.0005, 0.001]))
            self.node.crash()
            self.store.writer.crash()
            self.disk.crash(self.rng, torn=self.rng.random() < 0.5)
        else:
            self.send_deferred()
            await self.store.close()
            await self.node.close()


async def _run(seed: int) -> None:
    rng = random.Random(seed)
    disk = SimDisk()
    model = {"answered": {}, "meant": {}, "body": {}, "next_ledger": 0}
    for _ in range(6):
        life = _Life(rng, disk, model)
        await life.open()
        for _ in range(rng.randrange(20, 120)):
            await life.step()
        await life.end(crash=rng.random() < 0.8)
    life = _Life(rng, disk, model)
    await life.open()
    await life.end(crash=False)


@pytest.mark.parametrize("seed", range(40))
def test_random_lives_keep_every_answered_entry_and_claim_none_not_taken(seed, monkeypatch):
    monkeypatch.setattr(limits, "own_positions_checkpoint_bytes", 2048)  # checkpoints many times a life
    simloop.run(_run(seed))


def test_a_checkpoint_lists_only_what_the_mark_covers():
    owns = {5: own_copy.Own(3, 0, 1, 0), 6: own_copy.Own(4, 10, 1, 0)}
    owns[5].pos.extend([100, 200, 300])
    owns[6].pos.extend([350])
    mark, got = own_copy.decode_checkpoint(own_copy.encode_checkpoint(300, owns, 0))
    assert mark == 300 and {k: list(v) for k, v in got.items()} == {5: [100, 200]}
    data = bytearray(own_copy.encode_checkpoint(400, owns, 0))
    data[20] ^= 1
    assert own_copy.decode_checkpoint(bytes(data)) is None, "a broken checkpoint is none"
