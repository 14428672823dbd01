"""The bundle logs a cluster node owns, replicated (docs/cluster.md, "A log is a sequence of ledgers" and
"Ownership, fencing and recovery"). Owns the rules:

  * a data record of an owned bundle is answered only once Qa members of its ledger's ensemble hold it durable
    (the node's own journal keeps its working copy besides: the state it applies and the messages it reads);
  * a log's ledgers are listed under `ledgers/<log>`, and the list changes only by a transaction that also
    requires this node to hold the bundle's owner key under the epoch it took it with — so a node that lost the
    bundle can neither close nor open a ledger of it;
  * taking a bundle over: fence and recover the last ledger if it is open (the old owner can no longer reach Qa),
    read the log back from where it was cut (its latest snapshot: the bundle's state, message indexes included),
    apply it (`Engine.load_log`: each message batch named by its log address, its bytes left in the ledgers),
    then open a ledger under the new epoch whose first entry is where the last one ended — and only then serve
    the bundle. A takeover costs the bundle's state and one snapshot interval of entries, not its backlog;
  * a message batch named by a log address is read from the ledger holding it when it is delivered (`fetch`: this
    node's own copy when it is a member, else another member's), into the reader's cache;
  * a member that fails or refuses rolls the ledger: it is closed at its last-add-confirmed entry and the
    unconfirmed entries are appended again, in order, to a new ledger on an ensemble without the failed member
    (fewer than E members while no other node is up, never fewer than Qa); a roll that finds the bundle taken
    by another node gives the bundle up, and every caller still waiting is answered UNAVAILABLE (it retries at
    the new owner, which holds every entry ever confirmed);
  * giving a bundle up (placement moved it): stop taking records, let the ones in flight be confirmed, close the
    ledger at its end, then release the owner key — the next owner then has nothing to recover;
  * repair: a closed ledger short of members that are up gets a new member only after every entry was copied
    there; a failed change of the list while the owner key is still ours is read again, never taken for a lost
    bundle.

The ledger list itself and the changes planned on it (ids, cuts, repair targets) are pigeon.cluster.ledgers'."""

from __future__ import annotations

import asyncio
import json
import logging
from array import array
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from pigeon.core import limits
from pigeon.cluster import metadata as M
from pigeon.cluster.ledgers import (LedgerInfo, NotOurs, TooFewNodes, ledger_id, new_ensemble, next_first,
                                    next_seq, read_from, reads, recovered, rolled, to_widen)
from pigeon.cluster.quorum import Replication
from pigeon.core.bundles import bundle_of_log
from pigeon.core.errors import Unavailable
from pigeon.node import hops
from pigeon.node.log_reads import LogReads
from pigeon.storage import formats
from pigeon.node.replication import LedgerRolled, LedgerWriter, LocalMember, RecoveryFailed, recover_ledger

log = logging.getLogger("pigeon.ledgers")


_MOVED = "The topic's bundle moved to another node; retry."


class Lost(Exception):
    """The bundle is another node's now."""


class Conflict(Exception):
    """The ledger list changed since it was read, and the bundle is still this node's (another of its own
    changes — a roll, a repair — came first): read it again."""


@dataclass
class _Pending:
    rtype: int
    body: bytes
    fut: asyncio.Future
    where: tuple | None  # (log, offset, position, end) of its record in the node journal, when it has one
    at: int  # … that position, or where the node journal notes an entry it does not hold went (node.own_copy)
    waiters: list | None = None  # futures of when_confirmed, settled in the step that settles `fut`


@dataclass
class OwnedLog:
    log_id: int
    epoch: int
    ledger: LedgerInfo
    writer: LedgerWriter | None = None
    pending: deque = field(default_factory=deque)  # _Pending sent or to send, unconfirmed, in log order
    rolling: asyncio.Task | None = None
    released: bool = False
    next_offset: int = 0  # the log offset the next append gets (a roll resends in order: offsets stay)
    snapshot_at: int = 0  # the offset of the last snapshot written (or where this node took the log over)
    snapshot_time: float = 0.0  # when it was written (or the log taken over): the engine's clock
    bytes_since_snapshot: int = 0  # appended since the last snapshot
    ledgers_at_snapshot: int = 0  # how many ledgers the list held when the last snapshot was written
    snapshots: list = field(default_factory=list)  # (log offset, whether it has indexes) of confirmed snapshots
    start: int = 0  # where the log is read from on a takeover (the ledger list's cut)
    trimming: asyncio.Task | None = None
    ledgers: list = field(default_factory=list)  # the ledger list as this owner last wrote it (it alone changes it)
    # the publish batches this owner wrote in its term: their node journal positions (the addresses its broker
    # index names them by) and their log offsets, both ascending — a snapshot names them by log address
    own_at: array = field(default_factory=lambda: array("q"))
    own_offset: array = field(default_factory=lambda: array("q"))
    entry_bytes: int = 0  # the average size of the entries last fetched (how many to ask for next)
    taken_at: int = 0  # the log offset this owner's term starts at: the batches before it have log addresses
    reading_ahead: list = field(default_factory=list)  # (first offset, end, task) of the reads ahead under way

    @property
    def bundle(self) -> int:
        return bundle_of_log(self.log_id)


class BundleLogs:
    def __init__(self, cluster, replication: Replication):
        self.cluster = cluster  # pigeon.node.cluster_node.ClusterNode
        self.meta, self.store = cluster.meta, cluster.store
        self.replication = replication
        self.me = cluster.info.node_id
        self._owner_values: dict[tuple[str, int], bytes] = {}  # (node, epoch) → an owner key's value (_owner_cmp)
        self.logs: dict[int, OwnedLog] = {}  # the logs served now
        self._clients: dict = {}  # address → a peer's storage service (node.host: StorageClient)
        self._local = LocalMember(self.store)
        self._append_at: dict[str, str] = {}  # node → its append channel, as last read from the membership
        self.taken = 0  # takeovers done (statistics)
        self.rolls = 0
        # members that failed a write lately (node → when): left out of new ensembles until their session has
        # surely ended if they are dead (twice its time to live), so ledgers do not roll onto them again
        self._suspects: dict[str, float] = {}
        self._suspect_s = 2 * cluster.config.session_ttl_s
        self._heard: dict[str, float] = {}  # peer → when it last answered this node
        self._live_seen: set[str] = set()  # the nodes whose session was live at members_ended's last look
        self.cluster_format = 1  # the format the cluster speaks (storage.formats), as storage_nodes last read it
        self.reads = LogReads(self)  # message batches named by log addresses, read from their ledgers

    # --- the engine's side -------------------------------------------------------------------------------
    def serving(self, log_id: int) -> bool:
        return log_id in self.logs

    def append(self, log_id: int, rtype: int, body: bytes, where: tuple | None = None) -> asyncio.Future:
        """Replicate one record of an owned log: a future done once Qa members hold it durable; it fails with
        Unavailable when the log is not (or no longer) this node's. `where`: (log, offset, position, end) of the
        record in the node journal, when it was written there (else a marker there says where it went: own_copy)."""
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        ol = self.logs.get(log_id)
        if ol is None:
            fut.set_exception(Unavailable(_MOVED))
            return fut
        p = _Pending(rtype, body, fut, where, where[2] if where else self.cluster.engine.journal.mark(log_id))
        ol.pending.append(p)
        self.reads.noted(ol, rtype, where)
        ol.next_offset += 1
        ol.bytes_since_snapshot += len(body)
        if ol.rolling is None:
            self._send(ol, p)
        return fut

    def unsent_from(self) -> int | None:
        """Where the node journal holds the first record of an owned log not yet confirmed (node.own_copy)."""
        return min((ol.pending[0].at for ol in self.logs.values() if ol.pending), default=None)

    def flush(self, log_id: int) -> None:
        """Somebody waits for the log's records: send the ones lingering to the members now."""
        ol = self.logs.get(log_id)
        if ol is not None and ol.writer is not None:
            ol.writer.flush()

    def _send(self, ol: OwnedLog, p: _Pending) -> None:
        try:  # (a roll is heard of from the writer's on_roll: the pending entries go to the next ledger)
            ol.writer.append(p.rtype, p.body, p.where, confirmed=partial(self._confirmed, ol, p))
        except LedgerRolled:
            self.start_roll(ol)

    def when_confirmed(self, log_id: int) -> asyncio.Future | None:
        """A future of the caller's own, done in the very step that confirms the log's latest record so far (and so
        every one before it), or failed with Unavailable if the log moves first; None when none is unconfirmed. The
        record's own future tells its waiters a turn of the loop later (its done callbacks are scheduled, then the
        waiter's), and a waiter cancelled must not cancel it: the shield around it costs a turn more."""
        ol = self.logs.get(log_id)
        if ol is None or not ol.pending:
            return None
        p = ol.pending[-1]
        fut = asyncio.get_running_loop().create_future()
        if p.waiters is None:
            p.waiters = [fut]
        else:
            p.waiters.append(fut)
        return fut

    @staticmethod
    def _confirmed(ol: OwnedLog, p: _Pending) -> None:
        # the writer confirms in log order: p is the oldest unconfirmed entry
        if ol.pending and ol.pending[0] is p:
            ol.pending.popleft()
            if hops.ON:
                hops.mark("confirmed")
            _settle(p, None)

    # --- ledgers in etcd -----------------------------------------------------------------------------------
    def _owner_cmp(self, bundle: int, epoch: int) -> M.Cmp:
        key = (self.me, epoch)  # (every change of a ledger list carries one: its value is made once an epoch)
        value = self._owner_values.get(key)
        if value is None:
            if len(self._owner_values) >= 1024:
                self._owner_values.clear()
            value = self._owner_values[key] = json.dumps({"node": self.me, "epoch": epoch}).encode()
        return M.holds(M.owner_key(bundle), value)

    def owner_guard(self, log_id: int, epoch: int) -> M.Cmp:
        """The comparison a change this node makes in etcd as the owner of `log_id` under `epoch` requires: the
        owner key holds this node at that epoch (a node that lost the log, knowing it or not, changes nothing)."""
        return self._owner_cmp(bundle_of_log(log_id), epoch)

    async def read_ledgers(self, log_id: int) -> tuple[M.KV | None, list[LedgerInfo]]:
        kv = await self.meta.get(M.ledgers_key(log_id))
        return kv, LedgerInfo.decode_list(kv.value if kv else None)

    async def put_ledgers(self, log_id: int, epoch: int, kv: M.KV | None, ledgers: list[LedgerInfo]) -> None:
        key = M.ledgers_key(log_id)
        ok, _ = await self.meta.txn([M.unchanged_since(kv) if kv else M.absent(key),
                                     self._owner_cmp(bundle_of_log(log_id), epoch)],
                                    [M.Put(key, LedgerInfo.encode_list(ledgers))])
        if not ok:
            owner = await self.meta.get(M.owner_key(bundle_of_log(log_id)))
            if owner is not None and M.compare(self._owner_cmp(bundle_of_log(log_id), epoch), owner):
                raise Conflict(f"the ledger list of log {log_id} changed meanwhile")
            raise Lost(f"bundle {bundle_of_log(log_id)} changed hands")
        ol = self.logs.get(log_id)
        if ol is not None and ol.epoch == epoch:
            ol.ledgers = ledgers

    async def storage_nodes(self) -> dict:
        """node → NodeInfo of the nodes new ledgers (and repairs) may use: listening, and not cut off."""
        nodes = await self.cluster.membership.members()
        self._append_at = {n: i.append for n, i in nodes.items() if i.append}
        self.cluster_format = formats.cluster_format([i.format for i in nodes.values()])
        return {n: i for n, i in nodes.items() if i.listening and not i.cut_off}

    async def store_answers(self) -> bool:
        """Whether etcd answers a read now. A roll of the writer's own accord (a snapshot, a wider ensemble) stops
        the log's ledger before the next one is written in etcd, and the log's appends wait until it is: begun on the
        word of the last keepalive (up to a third of a session old) just as etcd went down, it would hold them for
        the whole outage, through which an open ledger goes on taking appends."""
        try:
            await asyncio.wait_for(self.meta.get(M.PLACEMENT_KEY), limits.store_check_s)
            return True
        except (M.StoreUnavailable, TimeoutError):
            return False

    async def speaks(self) -> int:
        """The format every node of the cluster reads now (storage.formats), from the members as etcd holds them
        (`cluster_format` is as the last choice of members read it: none yet on a node that has opened no
        ledger)."""
        nodes = await self.cluster.membership.members()
        self.cluster_format = formats.cluster_format([i.format for i in nodes.values()])
        return self.cluster_format

    async def answering(self, peers: dict, timeout: float) -> int:
        """How many of `peers` (node → NodeInfo) answer a storage call within `timeout`."""
        answers = await asyncio.gather(*(self.member(n, i.dial).answers(timeout) for n, i in peers.items()))
        for n, ok in zip(peers, answers):
            if ok:
                self._heard_from(n)
        return sum(answers)

    def _heard_from(self, node: str) -> None:
        self._heard[node] = asyncio.get_running_loop().time()

    def heard_within(self, seconds: float) -> set[str]:
        """The peers that answered this node (a write of its ledgers, a storage call) within the last `seconds`:
        an owner with nothing to write hears nothing, and learns it is cut off only by asking."""
        now = asyncio.get_running_loop().time()
        return {n for n, t in self._heard.items() if now - t <= seconds}

    def failed_within(self, seconds: float) -> set[str]:
        """The members that failed a write of this node's within the last `seconds`."""
        now = asyncio.get_running_loop().time()
        return {n for n, t in self._suspects.items() if now - t <= seconds}

    def suspected(self) -> set[str]:
        now = asyncio.get_running_loop().time()
        for n in [n for n, t in self._suspects.items() if now - t > self._suspect_s]:
            del self._suspects[n]
        return set(self._suspects)

    async def _new_ledger(self, log_id: int, epoch: int, seq: int, first: int, avoid=()) -> LedgerInfo:
        """A ledger on an ensemble of the live nodes (cluster.ledgers.new_ensemble decides which)."""
        lid = ledger_id(log_id, seq)
        members = await self.storage_nodes()
        try:
            chosen = new_ensemble(lid, {n: i.zone for n, i in members.items()},
                                  {n: i.machine for n, i in members.items()}, set(avoid) | self.suspected(),
                                  self.replication, self.me)
        except TooFewNodes as e:
            raise Unavailable(str(e)) from None
        return LedgerInfo(lid, epoch, {n: members[n].dial for n in chosen}, first)

    def client(self, address: str):
        """The storage client of the node dialled at `address` (one a node, kept)."""
        c = self._clients.get(address)
        if c is None:
            c = self._clients[address] = self.cluster.host.storage_client(address, self.cluster.config)
        return c

    def member(self, node: str, address: str):
        if node == self.me:
            return self._local
        c = self.client(address)
        c.append_at = self._append_at.get(node, "")  # (a restarted member announces a new one: the roll that its
        return c                                     # old one's failure causes reads the membership again)

    def _replication_of(self, lg: LedgerInfo) -> Replication:
        n = len(lg.members)
        return Replication(n, n, min(self.replication.ack_quorum, n))

    def _writer(self, ol: OwnedLog, lg: LedgerInfo) -> LedgerWriter:
        w = LedgerWriter(lg.id, lg.epoch, {n: self.member(n, a) for n, a in lg.members.items()},
                         self._replication_of(lg))
        w.on_roll = lambda: self.start_roll(ol)  # a member failed, perhaps with nothing waiting: roll now
        w.on_answer = self._heard_from
        return w

    # --- taking a bundle over ------------------------------------------------------------------------------
    async def take(self, bundle: int, epoch: int, stop: asyncio.Event | None = None) -> bool:
        """Take over `bundle` (its owner key was just claimed under `epoch`): recover, rebuild, open a ledger.
        Retries while etcd or too many members cannot be reached; False when the bundle was lost meanwhile."""
        log_id = bundle + 1
        while True:
            try:
                await self._take_once(log_id, epoch)
                return True
            except Lost as e:
                log.warning("taking bundle %d over stopped: %s", bundle, e)
                return False
            except (M.StoreUnavailable, RecoveryFailed, Unavailable, Conflict) as e:
                log.warning("taking bundle %d over: %s; trying again", bundle, e)
            if self.cluster.membership.owned.get(bundle) != epoch:
                return False
            await asyncio.sleep(limits.ledger_retry_s)

    async def _take_once(self, log_id: int, epoch: int) -> None:
        kv, ledgers = await self.read_ledgers(log_id)
        if ledgers and ledgers[-1].end is None:
            last = ledgers[-1]
            members = {n: self.member(n, a) for n, a in last.members.items()}
            ledgers = recovered(ledgers, await recover_ledger(last.id, members, self._replication_of(last),
                                                              self._ended(last)))
        entries, nbytes, read_s = await self._read_log(ledgers)
        first = next_first(ledgers)
        new = await self._new_ledger(log_id, epoch, next_seq(ledgers), first)
        await self.put_ledgers(log_id, epoch, kv, ledgers + [new])
        engine = self.cluster.engine
        loop = asyncio.get_running_loop()
        t_apply = loop.time()
        start = read_from(ledgers)
        await engine.load_log(log_id, entries, start)  # returns once the journal holds the state it built
        ol = OwnedLog(log_id, epoch, new, next_offset=first, snapshot_at=start, start=start, ledgers=ledgers + [new],
                      taken_at=first, snapshot_time=engine.clock.now())
        ol.writer = self._writer(ol, new)
        self.logs[log_id] = ol  # served from now on
        self.taken += 1
        self.cluster.handovers.resume(log_id)  # (a pair handed out of the log and not homed yet: finish it)
        log.info("took bundle %d over at epoch %d: %d entries (%.1f MB) from %d to %d in %d ledger(s) read in "
                 "%.2f s, applied and its state durable in %.2f s; ledger %d on %s", bundle_of_log(log_id), epoch,
                 len(entries), nbytes / 1e6, start, first, len(ledgers), read_s, loop.time() - t_apply, new.id,
                 ",".join(new.members))

    async def _read_log(self, ledgers: list[LedgerInfo]) -> tuple[list[tuple[int, bytes]], int, float]:
        """Every entry of the log from where it was cut (its latest snapshot), in order, from the members of its (closed) ledgers; their
        bytes and the seconds it took. Each call asks for about limits.log_read_bytes, and the loop turns between
        calls: a log of big entries read back from this node's own copy (no await inside) held the loop for seconds, and the
        node's etcd session ended."""
        out: list[tuple[int, bytes]] = []
        loop = asyncio.get_running_loop()
        t0, nbytes, step = loop.time(), 0, limits.log_read_first_entries
        for lg, start, n in reads(ledgers):
            count = start + n
            while start < count:
                end = min(count, start + step)
                got = await self.read_range(lg, start, end)
                out.extend(got)
                start += len(got)
                nbytes += sum(len(b) for _, b in got)
                step = max(1, min(limits.log_read_entries_max, limits.log_read_bytes * len(out) // max(nbytes, 1)))
                await asyncio.sleep(0)
        return out, nbytes, loop.time() - t0

    async def read_range(self, lg: LedgerInfo, start: int, end: int) -> list[tuple[int, bytes]]:
        for node, address in self._read_order(lg):
            try:
                got = await self.member(node, address).read(lg.id, start, end)
            except Exception as e:  # noqa: BLE001 — another member may have it
                log.debug("reading ledger %d from %s failed: %s", lg.id, node, e)
                continue
            if got:
                return got
        raise RecoveryFailed(f"no member of ledger {lg.id} ({','.join(lg.members)}) answers with entries "
                             f"{start}..{end - 1}")

    def members_ended(self) -> None:
        """Fail at once, in the open ledgers of the logs this node writes, each member whose session ended since
        the last look: one the live view held then and holds no more. (Not one absent from the view alone: a node
        that joined since the view last heard would be failed in the ledgers just opened on it.)"""
        live = self._live_nodes()
        if live is None:
            return
        ended, self._live_seen = self._live_seen - live, live
        for ol in list(self.logs.values()):
            if ol.writer is not None:
                for m in ended & ol.writer.streams.keys():
                    ol.writer.member_gone(m, "its session ended")

    def _ended(self, lg: LedgerInfo) -> frozenset[str]:
        """The members of `lg` whose session is not live, as the view holds the node keys (none while the view is
        not live: etcd out of reach tells nothing)."""
        live = self._live_nodes()
        return frozenset() if live is None else frozenset(n for n in lg.members if n not in live and n != self.me)

    def _live_nodes(self, reachable: bool = False) -> set[str] | None:
        """The nodes whose session is live (and, `reachable`, whose record does not say "cut_off": node.membership's
        NodeInfo), as the membership's view holds their keys; None while the view is not live (etcd out of reach)."""
        view = self.cluster.membership.view
        if not view.live:
            return None
        n, kvs = len(M.node_key("")), view.kvs[M.node_key("")].values()
        return {kv.key[n:] for kv in kvs if not (reachable and json.loads(kv.value).get("cut_off"))}

    def _read_order(self, lg: LedgerInfo) -> list[tuple[str, str]]:
        """The members a read asks, in turn: this node's own copy first, then those whose session is live (as the
        view holds the node keys), that do not say they are cut off from their peers and that failed no write
        lately, the others last. A member that neither answers nor refuses (a paused process, one cut off) holds
        each read for limits.storage_call_s (10 s) — and a ledger's first member is its writer, the very node whose
        bundle is being taken over: a takeover from a paused owner on a 4-node cluster read its log for 10.7–11.4 s,
        one from an owner cut off from its peers (which steps down saying so) for 10 s."""
        live, suspected = self._live_nodes(reachable=True), self.suspected()
        return sorted(lg.members.items(), key=lambda m: (m[0] != self.me, live is not None and m[0] not in live,
                                                         m[0] in suspected))

    # --- rolling to a new ledger -----------------------------------------------------------------------------
    def start_roll(self, ol: OwnedLog) -> None:
        """(Pending entries' futures also start a roll once the writer fails them: one roll at a time.)"""
        if ol.rolling is None and not ol.released:
            ol.rolling = asyncio.create_task(self._roll(ol), name=f"pigeon-roll-{ol.log_id}")

    async def _roll(self, ol: OwnedLog) -> None:
        old = ol.writer
        stop = old.rolled  # where and why the writer stopped
        close_at = ol.ledger.first + stop.close_at
        failed = set(old.failed)
        now = asyncio.get_running_loop().time()
        self._suspects.update({n: now for n in failed})
        for n in failed:
            self.cluster.check_peer(n)
        if failed:
            self.cluster.changed.set()  # placement looks now whether this node is cut off from its peers
        ol.writer = None
        await old.close(limits.ledger_close_drain_s)
        # (a roll planned — a snapshot, a larger ensemble — is routine: every second or so under load)
        (log.warning if failed else log.info)("log %d: ledger %d stops at %d (%s); %d entries go to the next",
                                              ol.log_id, ol.ledger.id, close_at, stop.why, len(ol.pending))
        waited = False
        while True:
            try:
                kv, ledgers = await self.read_ledgers(ol.log_id)
                try:
                    ledgers = rolled(ledgers, ol.ledger.id, close_at)
                except NotOurs as e:
                    raise Lost(str(e)) from None
                new = await self._new_ledger(ol.log_id, ol.epoch, next_seq(ledgers), close_at, avoid=failed)
                if not waited and set(new.members) & (failed | self.suspected()):
                    # only members that failed lately make an ensemble: give them a moment (a member that ends
                    # every stream at once — a node restarted under its old session, not serving yet — rolled
                    # the log every few milliseconds, hundreds of empty ledgers until the session ran out)
                    waited = True
                    await asyncio.sleep(limits.ledger_retry_s)
                    continue
                await self.put_ledgers(ol.log_id, ol.epoch, kv, ledgers + [new])
                break
            except Lost as e:
                self.lose(ol.log_id, str(e))
                return
            except Conflict:
                continue
            except (M.StoreUnavailable, Unavailable) as e:
                log.warning("log %d: cannot open the next ledger yet (%s); its publishes wait", ol.log_id, e)
            except asyncio.CancelledError:
                if ol.released or asyncio.current_task().cancelling():
                    raise
                log.exception("log %d: opening the next ledger was cancelled under it; trying again", ol.log_id)
            except Exception:  # a roll that ended here would leave the log's publishes waiting for good
                log.exception("log %d: opening the next ledger failed; trying again", ol.log_id)
            await asyncio.sleep(limits.ledger_retry_s)
        self.rolls += 1
        ol.ledger, ol.writer, ol.rolling = new, self._writer(ol, new), None
        for p in list(ol.pending):
            self._send(ol, p)
            if ol.rolling is not None:  # the new ledger failed at once: the next roll resends the rest
                break
        if ol.writer is not None and ol.pending:
            ol.writer.flush()  # their callers wait

    async def widen(self) -> int:
        """Move every open ledger narrower than machines up allow to a full ensemble (cluster.ledgers.to_widen
        decides which): the writer rolls of its own accord. How many rolled."""
        nodes = await self.storage_nodes()
        suspects = self.suspected()
        size, narrow = to_widen({ol.log_id: len(ol.ledger.members) for ol in self.logs.values()
                                 if ol.writer is not None and ol.rolling is None},
                                {n: i.zone for n, i in nodes.items() if n not in suspects},
                                {n: i.machine for n, i in nodes.items()}, self.replication)
        if not narrow or not await self.store_answers():
            return 0
        rolled = 0
        for log_id in narrow:
            ol = self.logs.get(log_id)
            if ol is not None and ol.writer is not None and ol.rolling is None:  # (as it was before the await)
                ol.writer.stop(f"moving to an ensemble of {size} (machines came up)")
                self.start_roll(ol)
                rolled += 1
        return rolled

    # --- giving a bundle up ------------------------------------------------------------------------------
    def lose(self, log_id: int, why: str) -> None:
        """The bundle is another node's: stop serving it, answer every waiting caller UNAVAILABLE."""
        ol = self.logs.pop(log_id, None)
        if ol is None:
            return
        ol.released = True
        self.reads.stop(ol)
        log.warning("bundle %d is no longer this node's (%s)", ol.bundle, why)
        self.cluster.membership.owned.pop(ol.bundle, None)
        self._fail(ol)
        if ol.writer is not None:
            asyncio.get_running_loop().create_task(ol.writer.close())
        self.cluster.engine.log_moved(log_id)
        self.cluster.engine.forget_log(log_id)

    def _fail(self, ol: OwnedLog) -> None:
        while ol.pending:
            _settle(ol.pending.popleft(), Unavailable(_MOVED))

    async def release(self, bundle: int) -> None:
        """Give `bundle` up: no new records, the ones in flight confirmed (a while at most), the ledger closed at
        its end. The owner key is the caller's to delete afterwards."""
        log_id = bundle + 1
        ol = self.logs.pop(log_id, None)
        if ol is None:
            return
        ol.released = True
        self.reads.stop(ol)
        self.cluster.engine.log_moved(log_id)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + limits.release_wait_s_max
        if ol.writer is not None:
            ol.writer.flush()
        while ol.pending and ol.rolling is None and loop.time() < give_up:
            await asyncio.sleep(0.01)
        if ol.rolling is not None or ol.writer is None:  # the next owner fences and recovers the ledger
            if ol.rolling is not None:
                ol.rolling.cancel()
            self._fail(ol)
            self.cluster.engine.forget_log(log_id)
            return
        writer, ol.writer = ol.writer, None
        end = ol.ledger.first + writer.machine.lac
        await writer.close(limits.ledger_close_drain_s)
        self._fail(ol)
        self.cluster.engine.forget_log(log_id)
        try:
            kv, ledgers = await self.read_ledgers(log_id)
            await self.put_ledgers(log_id, ol.epoch, kv, rolled(ledgers, ol.ledger.id, end))
        except (Lost, Conflict, M.StoreUnavailable, NotOurs) as e:  # the next owner fences and recovers it instead
            log.info("bundle %d given up without closing its ledger (%s)", bundle, e)

    async def close(self) -> None:
        for log_id in list(self.logs):
            ol = self.logs.pop(log_id)
            ol.released = True
            self.reads.stop(ol)
            if ol.rolling is not None:
                ol.rolling.cancel()
            if ol.writer is not None:
                await ol.writer.close(limits.ledger_close_drain_s)
            self._fail(ol)
        for c in self._clients.values():
            await c.close()
        self._clients.clear()


def _retrieve(fut: asyncio.Future) -> None:
    """Callers that do not wait (deliveries, acks on a stream) leave a failure unread: read it here."""
    if not fut.cancelled():
        fut.exception()


def _settle(p: _Pending, exc: BaseException | None) -> None:
    """The record's future, then its waiters' (whose tasks so resume after the record's done callbacks: a
    publish's delivery is shown before its publisher is answered)."""
    for f in [p.fut] + (p.waiters or []):
        if not f.done():
            if exc is None:
                f.set_result(None)
            else:
                f.set_exception(exc)
