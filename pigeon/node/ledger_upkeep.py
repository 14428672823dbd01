"""The upkeep of the bundle logs a node owns (docs/cluster.md, "Cutting a log" and "Repair"), performed over
node.bundle_logs: what to cut and where to copy is pigeon.cluster.ledgers'. Owns the rules:

  * every `log_snapshot_entries` entries or `log_snapshot_bytes` bytes — once its list holds more than
    limits.log_ledgers_snapshot ledgers, none of them opened since its last snapshot (an idle log moved again and
    again: each takeover opens a ledger), and every `log_snapshot_s` while its ledgers hold entries (an entry
    kept pins every later segment of its members' journals) — the owner writes the bundle's state into its log — message indexes included, each batch named by its log address — with no await between reading the state
    and appending it (the record lands right after every record the state applied), and each snapshot starts a
    ledger, so the ledgers before a cut leave the list whole;
  * a log is cut at its latest confirmed snapshot (a takeover reads from there on), keeping every ledger from the
    oldest message still needed on — as the log holds it: what the state shows acked is needed until the acks'
    records are in the log (a takeover that loses them needs the messages again) — by the owner-guarded change of
    its ledger list — and every ledger from the lowest offset a pair handed over out of the log still names
    (its `lent/` keys: invariant S1 across logs, docs/cluster.md "Scale-out" 4.3 step 4); the members of the ledgers
    cut off are then told to delete them (best effort: one that cannot be reached deletes them when it next
    compares the ledgers it holds with their lists: `collect_strays`);
  * lent keys: a hand-over writes the pair's `lent/<its old log>/<pair>` before its ShardOut (`lend`); every few
    seconds the owner of each log writes the lowest offset each of its pairs names of every other log where that
    rose, and deletes the keys of its pairs that name that log no more — both only once the state it read them
    from is durable, and each by compare-and-swap on the key as read; a cut deletes the keys of its log that name
    nothing needed (a topic gone for good; a pair in the log again, no hand-over out of it under way) — a delete
    only while the log is this node's, its owner key in the transaction (a state reset by the log's loss, or
    one behind its next owner's, shows a pair handed out as back, its hand-over not under way); and while
    no hand-over can have happened (`lent_about`) none of this asks etcd anything;
  * repair: a closed ledger short of members that are up gets a new member only after every entry was copied
    there — a copy whose stream ends before the last entry was answered has failed — and a failed change of the
    list while the owner key is still ours is read again, never taken for a lost bundle."""

from __future__ import annotations

import asyncio
import logging

from pigeon.broker import images
from pigeon.cluster import metadata as M
from pigeon.core import limits
from pigeon.core.errors import Unavailable
from pigeon.cluster.ledgers import LEDGER_SEQ_BITS, LedgerInfo, cut_at, repair_target
from pigeon.cluster.quorum import ensemble_size
from pigeon.node.bundle_logs import BundleLogs, Conflict, Lost, OwnedLog
from pigeon.node.ledger_store import FENCE_EPOCH
from pigeon.node.log_reads import Unnamed
from pigeon.node.replication import RecoveryFailed
from pigeon.storage import formats

log = logging.getLogger("pigeon.ledgers")

LENT_CHECK_S = 5.0  # how often an owner brings the `lent/` keys of its pairs up to date


class LedgerUpkeep:
    def __init__(self, bundles: BundleLogs):
        self.bundles = bundles
        self.under_replicated = 0  # closed ledgers short of members that are up, at the last repair pass
        self._repairing: asyncio.Task | None = None
        self._clean: tuple | None = None  # (what a pass depends on, when) at the last pass that found nothing short
        self._strays: asyncio.Task | None = None
        self._strays_next = 0.0  # (the loop's time) the next look for ledgers no list names
        self._lent: asyncio.Task | None = None
        self._lent_next = 0.0  # (the loop's time) the next pass over the `lent/` keys

    def close(self) -> None:
        for task in (self._repairing, self._strays, self._lent):
            if task is not None:
                task.cancel()

    # --- cutting logs -----------------------------------------------------------------------------------------
    async def compact(self) -> None:
        """Write a snapshot into each owned log that grew by `log_snapshot_entries` (or `log_snapshot_bytes`) since
        its last one, lists too many ledgers, or holds entries and had none for `log_snapshot_s`; and cut logs
        where a confirmed snapshot allows (in the background): the log is read from there on takeover, and
        the ledgers wholly before it leave the list."""
        config = self.bundles.cluster.config
        now = self.bundles.cluster.engine.clock.now()
        due = [ol for ol in self.bundles.logs.values()
               if not ol.released and ol.rolling is None and (
                   ol.next_offset - ol.snapshot_at >= config.log_snapshot_entries or
                   ol.bytes_since_snapshot >= config.log_snapshot_bytes or
                   len(ol.ledgers) > max(limits.log_ledgers_snapshot, ol.ledgers_at_snapshot + 1) or
                   (now - ol.snapshot_time >= config.log_snapshot_s and _holds_entries(ol)))]
        # a snapshot starts a ledger, which takes a write to etcd: only right after etcd answered (through an outage
        # the open ledger goes on taking appends; one stopped for a snapshot would hold them until etcd is back)
        if due and self.bundles.cluster.membership.answering and await self.bundles.store_answers():
            for ol in due:
                if not ol.released and ol.rolling is None:  # (as it was before the await)
                    self._snapshot(ol)
        for ol in list(self.bundles.logs.values()):
            if ol.snapshots and not ol.released and (ol.trimming is None or ol.trimming.done()):
                ol.trimming = asyncio.get_running_loop().create_task(self._cut_logged(ol),
                                                                     name=f"pigeon-cut-{ol.log_id}")
        self._start_lent()

    def _snapshot(self, ol: OwnedLog) -> None:
        """Append the bundle's state to its log. No await between reading the state and appending: the record
        lands right after every record the state has applied."""
        engine = self.bundles.cluster.engine
        if ol.writer is not None and ol.rolling is None:  # it starts a ledger: the ones before can go whole
            ol.writer.stop("a snapshot starts the next ledger")
            self.bundles.start_roll(ol)
        ol.ledgers_at_snapshot, ol.snapshot_time = len(ol.ledgers), engine.clock.now()
        offset, indexed = ol.next_offset, self.bundles.cluster_format >= 2
        try:
            rec = images.bundle_snapshot(engine.state, ol.log_id, self.bundles.cluster.config.bundles,
                                         lambda pos: self.bundles.reads.log_addresses(ol, pos), indexes=indexed)
        except Unnamed as e:  # (the log is not cut again while that batch is kept: correct, only slower to move)
            log.warning("no snapshot of log %d: %s", ol.log_id, e)
            ol.snapshot_at, ol.bytes_since_snapshot = offset, 0
            return
        fut = self.bundles.append(ol.log_id, rec.TYPE, b"".join(rec.parts()))
        ol.snapshot_at, ol.bytes_since_snapshot = offset, 0

        def confirmed(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is None:
                ol.snapshots.append((offset, indexed))
        fut.add_done_callback(confirmed)

    async def _cut_logged(self, ol: OwnedLog) -> None:
        try:
            await self.cut(ol)
        except asyncio.CancelledError:
            raise
        except (Lost, Conflict, M.StoreUnavailable) as e:  # the next pass tries again (or the log is gone)
            log.info("cutting log %d: %s", ol.log_id, e)
        except Exception:  # noqa: BLE001 — the next pass tries again
            log.exception("cutting log %d failed", ol.log_id)

    async def cut(self, ol: OwnedLog) -> bool:
        """Move where a takeover reads the log from to its latest confirmed snapshot, and drop the ledgers that end
        before both it and the oldest message batch the bundle's index still keeps — and the lowest one a pair
        handed over out of the log still names (its `lent/` keys) —, by the owner-guarded transaction. Whether the
        list changed."""
        engine = self.bundles.cluster.engine
        need = images.bundle_need(engine.state, ol.log_id, self.bundles.cluster.config.bundles,
                                  lambda a: self.bundles.reads.log_offset(ol, a))
        # the state may hold acks (dead letters acked, say) whose records are not in the log yet: through an etcd
        # outage no next ledger opens, and a takeover then reads the log without them — its subscriptions need
        # those messages again. So nothing is cut for `need` before every record it reflects is durable.
        try:
            await engine.durable(log_id=ol.log_id)
        except Unavailable as e:  # (the log moved meanwhile)
            log.info("cutting log %d: %s", ol.log_id, e.message)
            return False
        usable = [o for o, indexed in ol.snapshots if indexed or o <= need]  # (one of cluster format 1 names no
        if not usable:                                                   # message: the entries after it must)
            return False
        at = max(usable)
        plan = cut_at(ol.ledgers, at, need)
        if plan is None or (at == ol.start and not plan[1]):
            return False
        # the keys are read after `need` was: a pair's key is put before its ShardOut, so a pair `need` left out
        # (handed out) has its key in by then; and `need` is taken again with them, in the same step: a pair that
        # came back to the log meanwhile (its key no longer counted) counts there
        lent = None
        if self.lent_about():
            lent, again = await self._lent_low(ol)
            need = min(need, again)
            try:
                await engine.durable(log_id=ol.log_id)
            except Unavailable as e:
                log.info("cutting log %d: %s", ol.log_id, e.message)
                return False
        kv, ledgers = await self.bundles.read_ledgers(ol.log_id)
        # (a key below the list's first ledger pins what is left: it names nothing a cut could keep any more,
        # and must not stop the reading point from moving on)
        if lent is not None and ledgers:
            need = min(need, max(lent, ledgers[0].first))
        plan = cut_at(ledgers, at, need)
        if plan is None or (at == ol.start and not plan[1]):
            return False
        keep, dropped = plan
        await self.bundles.put_ledgers(ol.log_id, ol.epoch, kv, keep)
        moved, ol.start = at != ol.start, at
        ol.ledgers_at_snapshot = min(ol.ledgers_at_snapshot, len(keep))
        ol.snapshots = [(o, indexed) for o, indexed in ol.snapshots if o >= at]
        self.bundles.reads.forget_before(ol, keep[0].first)
        if dropped or moved:
            log.info("log %d is read from %d now (a snapshot), kept from %d: %d ledger(s) dropped", ol.log_id, at,
                     keep[0].first, len(dropped))
        await self._delete(dropped)
        return True

    def lent_about(self) -> bool:
        """Whether `lent/` keys may be about: from the cluster format after spread topics' on (hand-overs come with
        a format of their own), and before it when this node's state shows a pair handed over (a topic's hand-over
        numbers, a ShardOut pending) or it lent one itself. (A cluster that never hands a pair over asks etcd for
        nothing more than it did.)"""
        return (self.bundles.cluster_format > formats.CLUSTER_SPREAD or bool(self.bundles.reads.lending) or
                any(t.gens or t.away for t in self.bundles.cluster.engine.state.topics_by_uid.values()))

    async def _lent_low(self, ol: OwnedLog) -> tuple[int | None, int]:
        """(the lowest offset of the log a pair handed over out of it still names — its `lent/` keys; None when
        none does —, the log's own need, taken right after the keys were read). A key that names nothing needed is
        deleted: one of a topic gone for good (deleted, and its subscriptions too: no message of it is read again),
        and one of a pair in this log now — back, or never gone (a hand-over given up) — with no hand-over out of
        it under way (`lend`): the need taken with the keys counts what it names here. That last only once the
        metadata log is caught up: one behind would show a pair homed elsewhere since as still here."""
        b = self.bundles
        state, bundles, meta_log = b.cluster.engine.state, b.cluster.config.bundles, b.cluster.engine.meta_log
        kvs = await b.meta.list(M.lent_prefix(ol.log_id))
        keys = [(kv, M.split_lent_key(kv.key)) for kv in kvs]
        if meta_log is not None and any(key is not None and self._here(key) for _, key in keys):
            await meta_log.catch_up()
        need = images.bundle_need(state, ol.log_id, bundles, lambda a: b.reads.log_offset(ol, a))
        # the state speaks for the log only while the log is this node's still: one lost meanwhile was reset (a pair
        # handed out of it looks back, with no hand-over under way) — and the owner key guards each delete, for a
        # node that lost the log without knowing it yet (its state lacks what the next owner did since)
        ours = b.logs.get(ol.log_id) is ol and not ol.released
        low, stale = None, []
        for kv, key in keys:
            if key is None:
                continue
            if ours and ((key[1] < state.next_uid and key[1] not in state.topics_by_uid) or
                         (meta_log is not None and self._here(key))):
                stale.append(kv)
                continue
            value = _lent_value(kv)
            low = value if low is None else min(low, value)
        for kv in stale:
            if (await b.meta.txn([M.unchanged_since(kv), b.owner_guard(ol.log_id, ol.epoch)],
                                 [M.Delete(kv.key)]))[0]:
                log.info("log %d: lent key %s deleted (it names nothing needed)", ol.log_id, kv.key)
            else:  # (kept: it counts)
                low = _lent_value(kv) if low is None else min(low, _lent_value(kv))
        return low, need

    def _here(self, key: tuple[int, int, int]) -> bool:
        """Whether the pair of lent key `key` is in the key's log now, with no hand-over out of it under way."""
        state = self.bundles.cluster.engine.state
        log_id, uid, shard = key
        t = state.topics_by_uid.get(uid)
        return (t is not None and shard < len(t.shards) and shard not in t.away
                and key not in self.bundles.reads.lending
                and state.shard_logs(t, self.bundles.cluster.config.bundles)[shard] == log_id)

    # --- lent keys (docs/cluster.md, "Scale-out" 4.3 step 4) ----------------------------------------------------
    def _start_lent(self) -> None:
        loop = asyncio.get_running_loop()
        if not self.bundles.logs or (self._lent is not None and not self._lent.done()) or \
                loop.time() < self._lent_next:
            return
        self._lent_next = loop.time() + LENT_CHECK_S
        if self.lent_about():
            self._lent = loop.create_task(self._keep_lent_logged(), name="pigeon-lent")

    async def _keep_lent_logged(self) -> None:
        try:
            await self.keep_lent()
        except asyncio.CancelledError:
            raise
        except (M.StoreUnavailable, Unavailable) as e:  # the next pass tries again
            log.info("keeping lent keys: %s", e)
        except Exception:  # noqa: BLE001 — the next pass tries again
            log.exception("keeping lent keys failed")

    async def keep_lent(self) -> tuple[int, int]:
        """Bring the `lent/` keys of the pairs of the logs this node owns up to date: for each other log a pair's
        index names batches of, its key holds the lowest offset of them it names — written where that rose (or the
        key is missing) — and the key of a pair that names no batch of that log any more is deleted, the key for
        the log it is in too (its own batches are that log's need) unless a hand-over out of it is under way
        (`lend` marks it). Nothing is asked of etcd while no pair here was ever handed over. (keys written, keys
        deleted)

        A write needs no owner guard: what is written is read from a state whose records are durable in its log
        (awaited first: a takeover that loses records would name more), and a pair's index only ever names fewer
        batches of a log it left as acks trim it — it gets batches of another log only with a new image (a
        ShardIn, a snapshot read back), a new index object, which is checked for before each change. So a stale
        owner — one whose log was taken over, whose state ends at an earlier record — writes an offset no higher
        than its successor would. A delete has one: the key of the log a pair is in goes while no hand-over out of
        it is under way here, and a stale owner cannot know of one its successor began — so the owner key of that
        log must hold this node at its epoch. Every change is a compare-and-swap on the key as read, so none lands
        over a `lend` made meanwhile."""
        b = self.bundles
        engine, bundles = b.cluster.engine, b.cluster.config.bundles
        state = engine.state
        held: dict[tuple[int, int], tuple[int, object]] = {}  # pair → (the owned log it is in, its index)
        want: dict[tuple[int, int, int], int] = {}  # (other log, topic uid, shard) → the lowest offset named
        moved = False  # (a pair here was handed over once: a key of it may be there)
        for ol in list(b.logs.values()):
            if ol.released:
                continue
            for t, shards in state.log_shards(ol.log_id, bundles):
                held.update(((t.uid, k), (ol.log_id, t.shards[k])) for k in shards if k not in t.away)
                moved = moved or any(t.gens.get(k, 0) for k in shards)
            for other, pairs in images.lent_map(state, ol.log_id, bundles).items():
                want.update(((other, uid, k), low) for (uid, k), low in pairs.items())
        b.reads.lending = {m for m in b.reads.lending if held.get(m[1:], (None,))[0] == m[0]}  # (handed out now)
        if not moved and not want:
            return 0, 0
        for log_id in {at for at, _ in held.values()}:
            try:
                await engine.durable(log_id=log_id)
            except Unavailable:  # (the log moved meanwhile: its next owner sees to its pairs)
                held = {p: h for p, h in held.items() if h[0] != log_id}
        have = {key: kv for kv in await b.meta.list(M.LENT_PREFIX) if (key := M.split_lent_key(kv.key)) is not None}
        written = deleted = 0
        for key, low in want.items():
            kv, pair = have.get(key), key[1:]
            if pair not in held or (kv is not None and _lent_value(kv) >= low) or not self._still(pair, held[pair]):
                continue
            k = M.lent_key(*key)
            ok, _ = await b.meta.txn([M.unchanged_since(kv) if kv else M.absent(k)], [M.Put(k, str(low).encode())])
            written += ok
        for key, kv in have.items():
            pair = key[1:]
            # (a key for the log the pair is in goes too — of an earlier stay, or of a hand-over that never went
            # out — but while a hand-over out of it is under way: `lend` marks it until its ShardOut is committed)
            if pair not in held or key in want or not self._still(pair, held[pair]) or key in b.reads.lending:
                continue
            ol = b.logs.get(held[pair][0])  # (the owner of the log the pair is in deletes: not a stale one)
            if ol is None or ol.released:
                continue
            ok, _ = await b.meta.txn([M.unchanged_since(kv), b.owner_guard(ol.log_id, ol.epoch)], [M.Delete(kv.key)])
            deleted += ok
        if written or deleted:
            log.info("lent keys: %d written, %d deleted", written, deleted)
        return written, deleted

    def _still(self, pair: tuple[int, int], held: tuple[int, object]) -> bool:
        """Whether the pair is in that owned log still, with that index (no image loaded over it since)."""
        log_id, ix = held
        t = self.bundles.cluster.engine.state.topics_by_uid.get(pair[0])
        bundles = self.bundles.cluster.config.bundles
        return (t is not None and t.shards[pair[1]] is ix and pair[1] not in t.away and log_id in self.bundles.logs
                and self.bundles.cluster.engine.state.shard_logs(t, bundles)[pair[1]] == log_id)

    async def _delete(self, ledgers: list[LedgerInfo]) -> None:
        """Tell the members of ledgers no list names any more to delete them. A member that cannot be reached
        finds them itself later (`collect_strays`)."""
        by_member: dict[tuple[str, str], list[int]] = {}
        for lg in ledgers:
            for node, address in lg.members.items():
                by_member.setdefault((node, address), []).append(lg.id)

        async def one(node: str, address: str, ids: list[int]) -> None:
            try:
                await self.bundles.member(node, address).delete(ids)
            except Exception as e:  # noqa: BLE001 — best effort
                log.info("deleting ledgers %s on %s: %s", ids, node, e)
        await asyncio.gather(*(one(n, a, ids) for (n, a), ids in by_member.items()))

    def collect_strays(self) -> None:
        """Now and then (limits.stray_check_s), in the background: delete the ledgers this node stores that their
        log's list no longer names — a cut drops a prefix of the list and ids are never reused, so a ledger
        numbered below the list's first is gone for good (its members that could not be reached then still
        hold it: their journals would keep every segment after it)."""
        loop = asyncio.get_running_loop()
        if (self._strays is not None and not self._strays.done()) or loop.time() < self._strays_next:
            return
        self._strays_next = loop.time() + limits.stray_check_s
        self._strays = loop.create_task(self._collect_strays(), name="pigeon-strays")

    async def _collect_strays(self) -> int:
        store = self.bundles.cluster.store
        by_log: dict[int, list[int]] = {}
        for lid in store.kept():
            by_log.setdefault(lid >> LEDGER_SEQ_BITS, []).append(lid)
        gone = []
        try:
            for log_id, ids in sorted(by_log.items()):
                _, ledgers = await self.bundles.read_ledgers(log_id)
                if ledgers:
                    gone += [lid for lid in ids if lid & ((1 << LEDGER_SEQ_BITS) - 1) < ledgers[0].seq]
            if gone:
                log.info("deleting %d ledger(s) no list names any more: %s", len(gone), gone[:8])
                await store.delete(gone)
        except M.StoreUnavailable as e:  # the next time
            log.info("looking for ledgers no list names: %s", e)
        return len(gone)

    # --- repair -------------------------------------------------------------------------------------------------
    def start_repair(self) -> None:
        """Repair in the background (one pass at a time): see `repair` — unless the last pass found nothing short
        and nothing it depends on changed since (which nodes there are, which ones this node suspects, the logs it
        owns, a ledger closed), and limits.repair_check_s has not passed: a pass reads every owned log's ledger
        list from etcd, and placement asks for one every time it looks."""
        if self._repairing is not None and not self._repairing.done():
            return
        if self._clean is not None:
            inputs, at = self._clean
            if inputs == self._inputs() and asyncio.get_running_loop().time() - at < limits.repair_check_s:
                return
        self._repairing = asyncio.get_running_loop().create_task(self._repair_logged(), name="pigeon-repair")

    def _inputs(self) -> tuple:
        b = self.bundles
        return b.cluster.node_changes, b.rolls, frozenset(b.logs), frozenset(b.suspected())

    async def _repair_logged(self) -> None:
        inputs, at = self._inputs(), asyncio.get_running_loop().time()
        self._clean = None
        try:
            if await self.repair() == 0 and self.under_replicated == 0:
                self._clean = (inputs, at)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 — the next pass tries again
            log.warning("repairing ledgers: %s", e)

    async def repair(self) -> int:
        """Give every closed ledger of the logs this node owns as many members that are up as E allows: a member
        that is down (or missing: the ledger was opened while nodes were down) is replaced by a node that is up,
        after its entries were copied there from a member that has them; the ledger's member list then changes by
        the same owner-guarded transaction as every other change. How many ledgers were repaired."""
        members = await self.bundles.storage_nodes()
        up = set(members) - self.bundles.suspected()
        machine_of = {n: i.machine or n for n, i in members.items()}
        size = ensemble_size(up, machine_of, self.bundles.replication.ensemble)
        repaired = short = 0
        for log_id in list(self.bundles.logs):
            kv, ledgers = await self.bundles.read_ledgers(log_id)
            short += sum(1 for lg in ledgers if lg.end is not None and len([n for n in lg.members if n in up]) < size)
            for lg in ledgers:
                new = repair_target(lg, up, size, machine_of, {n: members[n].zone for n in up})
                if new is None:
                    continue
                live = [n for n in lg.members if n in up]
                await self._copy(lg, live, new, members[new].dial)
                ol = self.bundles.logs.get(log_id)
                if ol is None:
                    return repaired
                kv, ledgers = await self.bundles.read_ledgers(log_id)
                if all(other.id != lg.id for other in ledgers):  # the log was cut past it meanwhile
                    await self._delete([LedgerInfo(lg.id, lg.epoch, {new: members[new].dial}, lg.first)])
                    continue
                for other in ledgers:
                    if other.id == lg.id:
                        dead = [n for n in other.members if n not in up]
                        if dead:
                            del other.members[dead[0]]
                        other.members[new] = members[new].dial
                try:
                    await self.bundles.put_ledgers(log_id, ol.epoch, kv, ledgers)
                except (Lost, Conflict):  # the list changed meanwhile (a roll): the next pass looks again
                    return repaired
                repaired += 1
                log.info("ledger %d (log %d, entries %d..%d) copied to %s: on %s now", lg.id, log_id, lg.first,
                         lg.end - 1, new, ",".join([*live, new]))
                short -= 1
        self.under_replicated = short
        return repaired

    async def _copy(self, lg: LedgerInfo, sources: list[str], target: str, address: str) -> None:
        """Every entry of closed ledger `lg` onto `target` (entries it already holds are answered again)."""
        count = lg.end - lg.first
        if count == 0:
            return
        stream = self.bundles.member(target, address).open_append()
        try:
            start = 0
            while start < count:
                got = await self.bundles.read_range(lg, start, min(count, start + limits.log_read_entries_max))
                for i, (rtype, body) in enumerate(got):
                    stream.send(lg.id, FENCE_EPOCH, start + i, rtype, body)
                stream.flush()
                start += len(got)
            async for index, error in stream.answers():
                if error:
                    raise RecoveryFailed(f"copying ledger {lg.id} to {target}: {error}")
                if index >= count - 1:
                    return
            raise RecoveryFailed(f"copying ledger {lg.id} to {target}: {stream.why_ended} before every entry was "
                                 "answered")
        finally:
            stream.close()


async def lend(bundles: BundleLogs, source_log: int, topic_uid: int, shard: int,
               lowest_offset: int | None = None) -> int:
    """Keep the ledgers of `source_log` (a log this node owns) that pair (topic_uid, shard) names, for its hand-over
    out of the log (docs/cluster.md, "Scale-out" 4.3 step 4): puts its key `lent/<source_log>/<topic_uid>.<shard>`.
    Await it before the ShardOut is committed — and call `unlend` should that ShardOut then not be appended after
    all. The offset written: `lowest_offset`, or (None) the lowest offset of the log the pair's index names now —
    the log's next offset when it names none: all it is published from now on lies after — so the image of the
    ShardOut, made later, names none below it. The key stays while the hand-over is under way (a cut keeps it
    until the state has the ShardOut), then the pair's new owner raises it as acks trim the pair's index, and
    deletes it once it names nothing of the log. The offset written; Unavailable when the log is not this node's
    (any more) or the pair not in it, M.StoreUnavailable when etcd did not answer (then hand nothing over)."""
    ol = bundles.logs.get(source_log)
    if ol is None or ol.released:
        raise Unavailable(f"Log {source_log} is not this node's; retry.")
    if lowest_offset is None:
        state = bundles.cluster.engine.state
        t = state.topics_by_uid.get(topic_uid)
        if t is None or shard not in state.shards_in(t, source_log, bundles.cluster.config.bundles):
            raise Unavailable(f"Shard {shard} of topic {topic_uid} is not in log {source_log}; retry.")
        pos = t.shards[shard].pos
        i = images.own_first(pos, source_log)
        lowest_offset = bundles.reads.log_offset(ol, pos[i]) if i < len(pos) else ol.next_offset
    mark = (source_log, topic_uid, shard)
    bundles.reads.lending.add(mark)
    try:
        await bundles.meta.put(M.lent_key(source_log, topic_uid, shard), str(lowest_offset).encode())
    except BaseException:
        bundles.reads.lending.discard(mark)  # (the key the put may have made anyway goes at the next pass)
        raise
    return lowest_offset


def unlend(bundles: BundleLogs, source_log: int, topic_uid: int, shard: int) -> None:
    """The hand-over `lend` was called for has committed its ShardOut (the pair is away from the log: its key is
    kept for it by whoever holds it now), or will append none (the key goes at the log owner's next lent pass)."""
    bundles.reads.lending.discard((source_log, topic_uid, shard))


def _lent_value(kv: M.KV) -> int:
    """The offset a `lent/` key holds (0 — keep everything — should it not read as one)."""
    try:
        return int(kv.value)
    except ValueError:
        return 0


def _holds_entries(ol: OwnedLog) -> bool:
    """Whether the log's ledgers hold an entry (which pins its members' journal segments from there on)."""
    return bool(ol.ledgers) and ol.next_offset > ol.ledgers[0].first
