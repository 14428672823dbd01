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
    its ledger list; the members of the ledgers
    cut off are then told to delete them (best effort: one that cannot be reached deletes them when it next
    compares the ledgers it holds with their lists: `collect_strays`);
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

log = logging.getLogger("pigeon.ledgers")


class LedgerUpkeep:
    def __init__(self, bundles: BundleLogs):
        self.bundles = bundles
        self.under_replicated = 0  # closed ledgers short of members that are up, at the last repair pass
        self._repairing: asyncio.Task | None = None
        self._clean: tuple | None = None  # (what a pass depends on, when) at the last pass that found nothing short
        self._strays: asyncio.Task | None = None
        self._strays_next = 0.0  # (the loop's time) the next look for ledgers no list names

    def close(self) -> None:
        for task in (self._repairing, self._strays):
            if task is not None:
                task.cancel()

    # --- cutting logs -----------------------------------------------------------------------------------------
    def compact(self) -> None:
        """Write a snapshot into each owned log that grew by `log_snapshot_entries` (or `log_snapshot_bytes`) since
        its last one, lists too many ledgers, or holds entries and had none for `log_snapshot_s`; and cut logs
        where a confirmed snapshot allows (in the background): the log is read from there on takeover, and
        the ledgers wholly before it leave the list."""
        config = self.bundles.cluster.config
        now = self.bundles.cluster.engine.clock.now()
        # a snapshot starts a ledger, which takes a write to etcd: not while its last keepalive failed (through an
        # outage the open ledger goes on taking appends; one stopped for a snapshot would hold them until etcd is
        # back)
        snapshots = self.bundles.cluster.membership.answering
        for ol in list(self.bundles.logs.values()):
            if ol.released:
                continue
            if snapshots and ol.rolling is None and (ol.next_offset - ol.snapshot_at >= config.log_snapshot_entries or
                                       ol.bytes_since_snapshot >= config.log_snapshot_bytes or
                                       len(ol.ledgers) > max(limits.log_ledgers_snapshot,
                                                             ol.ledgers_at_snapshot + 1) or
                                       (now - ol.snapshot_time >= config.log_snapshot_s and _holds_entries(ol))):
                self._snapshot(ol)
            if ol.snapshots and (ol.trimming is None or ol.trimming.done()):
                ol.trimming = asyncio.get_running_loop().create_task(self._cut_logged(ol),
                                                                     name=f"pigeon-cut-{ol.log_id}")

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
        before both it and the oldest message batch the bundle's index still keeps, by the owner-guarded
        transaction. Whether the list changed."""
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
        kv, ledgers = await self.bundles.read_ledgers(ol.log_id)
        plan = cut_at(ledgers, at, need)
        if plan is None:
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


def _holds_entries(ol: OwnedLog) -> bool:
    """Whether the log's ledgers hold an entry (which pins its members' journal segments from there on)."""
    return bool(ol.ledgers) and ol.next_offset > ol.ledgers[0].first
