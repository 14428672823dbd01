"""A ledger read asks the members that can answer first. A paused member neither answers nor refuses: a read waits
for it until the call's limit (limits.storage_call_s, 10 s). A ledger's first member is its writer — the very
owner whose bundle another node takes over when that owner was paused past its session — and a random-fault run
on four nodes took 10.7–11.4 s to read such a log back, its publishes refused meanwhile."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pigeon.cluster import metadata as M
from pigeon.cluster.ledgers import LedgerInfo
from pigeon.cluster.quorum import Replication
from pigeon.node.bundle_logs import BundleLogs
from pigeon.node.membership import MetaView


class _Member:
    def __init__(self, name: str, paused: set[str], asked: list[str]):
        self.name, self.paused, self.asked = name, paused, asked

    async def read(self, ledger: int, start: int, end: int):
        self.asked.append(self.name)
        if self.name in self.paused:
            await asyncio.sleep(3600)  # never answers (the test bounds it)
        return [(1, b"entry")]


def _logs(me: str, live: list[str] | None) -> BundleLogs:
    view = MetaView()
    if live is not None:
        view.kvs[M.node_key("")] = {M.node_key(n): M.KV(M.node_key(n), b"{}", 1, 1) for n in live}
        view.live = True
    cluster = SimpleNamespace(meta=None, store=None, info=SimpleNamespace(node_id=me),
                              config=SimpleNamespace(session_ttl_s=5), membership=SimpleNamespace(view=view))
    return BundleLogs(cluster, Replication(3, 3, 2))


def _read(logs: BundleLogs, lg: LedgerInfo, paused: set[str]) -> list[str]:
    asked: list[str] = []
    logs.member = lambda node, address: _Member(node, paused, asked)

    async def go():
        return await asyncio.wait_for(logs.read_range(lg, 0, 1), 2.0)

    assert asyncio.run(go()) == [(1, b"entry")]
    return asked


LEDGER = LedgerInfo(id=1 << 20, epoch=1, members={"n2": "a2", "n3": "a3", "n4": "a4"}, first=0, end=1)


def test_a_member_whose_session_ended_is_asked_last():
    # n1 takes n2's bundle over: n2 (the writer, first in its ensemble) is paused and its node key gone
    assert _read(_logs("n1", live=["n1", "n3", "n4"]), LEDGER, paused={"n2"}) == ["n3"]


def test_this_nodes_own_copy_first_then_the_ensembles_order():
    assert _read(_logs("n3", live=["n2", "n3", "n4"]), LEDGER, paused=set()) == ["n3"]
    assert _read(_logs("n1", live=["n1", "n2", "n3", "n4"]), LEDGER, paused=set()) == ["n2"]


def test_a_writer_fails_a_member_whose_session_ended_but_not_one_the_view_has_not_seen_yet():
    """An owner's open ledgers fail a member whose session ended at once (a paused member would hold their appends
    for limits.member_silence_s) — one the view held and holds no more. A node that joined after the view last
    heard is in ledgers just opened on it (new ensembles read the members from etcd while the view lags): failing it
    there rolled them again and again, and left closed ledgers short of members."""
    logs = _logs("n1", live=["n1", "n2", "n3"])
    gone: list[tuple[str, str]] = []
    writer = SimpleNamespace(streams={"n1": None, "n2": None, "n4": None},
                             member_gone=lambda m, why: gone.append((m, why)))
    logs.logs[1] = SimpleNamespace(writer=writer)
    logs.members_ended()  # (the first look: nothing ended since an earlier one)
    assert gone == []
    view = logs.cluster.membership.view
    del view.kvs[M.node_key("")][M.node_key("n2")]  # n2's session ends; n4 is not in the view yet
    logs.members_ended()
    assert gone == [("n2", "its session ended")]
    view.live = False  # etcd out of reach: the view tells nothing
    view.kvs[M.node_key("")].clear()
    logs.members_ended()
    assert gone == [("n2", "its session ended")]


def test_a_member_that_says_it_is_cut_off_is_asked_last():
    # n1 takes n2's bundle over: n2 (the writer) is cut off from its peers — its session lives (it reaches etcd),
    # and its node record says it is cut off; a read that asked it first waited the call's whole limit
    logs = _logs("n1", live=["n1", "n2", "n3", "n4"])
    logs.cluster.membership.view.kvs[M.node_key("")][M.node_key("n2")] = M.KV(M.node_key("n2"),
                                                                                b'{"cut_off": true}', 1, 1)
    assert _read(logs, LEDGER, paused={"n2"}) == ["n3"]
