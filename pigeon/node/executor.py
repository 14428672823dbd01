"""The executor's one step: a validated record appended to its log and applied, in one step with no await — so the
log's order is the order of application. Owns the rules: a record goes to the log `BrokerState.log_of` names; a
log is fenced at the writer's epoch before its first append of a life (an older writer's appends are refused from
then on); the record is applied at the journal position it was appended at, and `apply` must not fail (every
check ran before the record was made). The node's engine (node.engine) and the deterministic simulator
(testing.simulator) both commit through `commit_step`: there is no second copy of it to drift."""

from __future__ import annotations

from pigeon.broker.state import BrokerState
from pigeon.core.bundles import META_LOG
from pigeon.core.errors import Unavailable
from pigeon.storage import records as R


def commit_step(state: BrokerState, logs, epoch: int, fenced: set[int], bundles: int, rec: R.Record,
                owner=None) -> tuple[int, int, int, list, list | None]:
    """Append `rec` to `logs` (the node's: node.logs.NodeLogs; the simulator's: testing.sync_journal.SyncJournal)
    and apply it: (log id, offset in its log, journal position, the record's parts, apply's effects). A record
    of a spread topic that names several shards is not given here: `BrokerState.split` cuts it first, one record
    a shard's log, each committed in turn (`commit`)."""
    log_id, offset, at, parts = append_step(state, logs, epoch, fenced, bundles, rec)
    return log_id, offset, at, parts, state.apply(rec, at, owner)


def commit(state: BrokerState, logs, epoch: int, fenced: set[int], bundles: int, rec: R.Record,
           owner=None, owns=None) -> list[tuple[R.Record, int, int, list | None]]:
    """`commit_step` of each record `rec` is committed as — itself, or one a shard of a spread topic's that names
    several (each durable and applied on its own, as on several owners): (record, its journal position, the
    journal's end after it, effects).
    A record, or a part, for a log this node does not `owns` — a spread topic's shard another node owns now, a
    bundle given up while a task still worked for it (a dead letter's ack) — refuses the whole record with
    Unavailable before anything is appended: a node writes only the logs it owns (an append to another's log
    fails, and its failure would stay that log's latest replication here, failing every later wait on it)."""
    if not state.spread:
        if owns is not None and not rec.META and not _owned(state.log_of(rec, bundles), owns):
            raise Unavailable("The topic's bundle moved to another node; retry.")
        _, _, at, _, effects = commit_step(state, logs, epoch, fenced, bundles, rec, owner)
        return [(rec, at, logs.journal.tail, effects)]
    parts = state.split(rec)
    if owns is not None and not all(_owned(state.log_of(p, bundles), owns) for p in parts):
        raise Unavailable("A shard of the topic moved to another node; retry.")
    out = []
    for part in parts:
        _, _, at, _, effects = commit_step(state, logs, epoch, fenced, bundles, part, owner)
        out.append((part, at, logs.journal.tail, effects))
    return out


def _owned(log_id: int, owns) -> bool:
    return log_id == META_LOG or owns(log_id)


def append_step(state: BrokerState, logs, epoch: int, fenced: set[int], bundles: int,
                rec: R.Record) -> tuple[int, int, int, list]:
    """Append `rec` to `logs` without applying it — the state already is what it says (a new owner's Snapshot of
    the state it built): (log id, offset in its log, journal position, the record's parts)."""
    log_id = state.log_of(rec, bundles)
    if log_id not in fenced:
        logs.fence(log_id, epoch)
        fenced.add(log_id)
    parts = rec.parts()
    offset, at = logs.append(log_id, epoch, rec.TYPE, parts)
    return log_id, offset, at, parts
