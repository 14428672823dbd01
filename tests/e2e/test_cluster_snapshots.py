"""Snapshots cut a bundle log: its owner writes the bundle's state into the log every so many entries (each
snapshot starting a ledger, its message indexes naming batches by log address), and a node taking the bundle over
reads the log from the latest one — only the entries from the snapshot on — while the ledgers of the messages
still needed are kept and read when those are delivered; the ledgers before every needed message leave the list
and the members' disks; nothing acknowledged is lost or comes back."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from pigeon.core.bundles import bundle_of
from tests.e2e.test_metrics import scrape
from tests.e2e.test_rest import call
from pigeon.testing.cluster import await_status, clients_of, ledgers_of, owners, start_nodes, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/cut"
BUNDLES = 16


def _pull_all(sub, name: str, want: set[str], timeout: float = 60.0) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not want <= set(got) and time.monotonic() < deadline:
        try:
            r = sub.pull(subscription=name, max_messages=200, timeout=10)
        except Exception:  # noqa: BLE001 — the bundle is moving for a moment
            time.sleep(0.2)
            continue
        got += [m.message.message_id for m in r.received_messages]
        if r.received_messages:
            sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in r.received_messages])
    return got


async def _held(nodes, ledgers: list[int]) -> dict:
    """(node, ledger) → entries still readable there."""
    from pigeon.node.replication import StorageClient

    out = {}
    for name, n in nodes.items():
        c = StorageClient(n.address)
        try:
            for lid in ledgers:
                got = await c.read(lid, 0, 1 << 20)
                if got:
                    out[(name, lid)] = len(got)
        finally:
            await c.close()
    return out


def test_a_takeover_reads_the_log_from_its_last_snapshot(etcd, tmp_path):
    nodes = start_nodes(str(tmp_path), etcd.endpoint, env={"PIGEON_LOG_SNAPSHOT_ENTRIES": "40"}, http=True)
    try:
        topic = topic_owned_by(owners(etcd.endpoint), "n1", f"{P}/topics/cut")
        log = bundle_of(topic, BUNDLES) + 1
        pub, sub = clients_of(nodes["n2"])
        pub.create_topic(name=topic)
        name = f"{P}/subscriptions/readers"
        sub.create_subscription(name=name, topic=topic)
        early = {pub.publish(topic, f"a{i}".encode()).result(timeout=30) for i in range(150)}
        assert set(_pull_all(sub, name, early)) == early

        backlog: set[str] = set()  # published and never pulled: older than the snapshots the log is cut at
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            backlog.add(pub.publish(topic, b"tick").result(timeout=30))  # entries, so the owner writes snapshots
            ledgers = ledgers_of(etcd.endpoint, log)
            read_at = [lg["start"] for lg in ledgers if lg.get("start")]
            if read_at and read_at[-1] > ledgers[0]["first"] and ledgers[0]["id"] > log << 20:
                break
        ledgers = ledgers_of(etcd.endpoint, log)
        read_at = [lg["start"] for lg in ledgers if lg.get("start")]
        assert read_at, f"the log was never cut: {ledgers}"
        assert read_at[-1] > ledgers[0]["first"], "the ledgers of the messages still waiting are kept"
        # a snapshot starts a ledger, so the ledgers before every needed message leave the list whole — and the
        # members' disks
        listed = {lg["id"] for lg in ledgers}
        dropped = [i for i in range(log << 20, ledgers[0]["id"]) if i not in listed]
        assert dropped, "a cut dropped ledgers"
        assert asyncio.run(_held(nodes, dropped)) == {}, "the members deleted the dropped ledgers"

        m = scrape(nodes["n1"].http)  # the owner's view, in its metrics
        assert m[("pigeon_cluster_bundles_owned", ())] >= 1 and m[("pigeon_cluster_ready", ())] == 1
        assert m[("pigeon_cluster_ledger_rolls_total", ())] >= 1, "each snapshot started a ledger"
        assert ("pigeon_cluster_under_replicated_ledgers", ()) in m
        # its own copy of the ledgers kept is borrowed from its journal, which keeps it: no more than the journal
        assert 0 < m[("pigeon_cluster_journal_held_bytes", ())] <= m[("pigeon_journal_bytes", ())]
        member = scrape(nodes["n2"].http)  # a member of n1's ledgers: their appends came over the append channel
        assert member[("pigeon_cluster_append_requests_total", (("transport", "channel"),))] > 0
        assert ("pigeon_cluster_ledger_cold_read_bytes_total", ()) in member  # (reads that did not wait for the disk)
        assert call(nodes["n2"].http, "GET", "/readyz") == (200, {"status": "ready"})

        kept = {pub.publish(topic, f"b{i}".encode()).result(timeout=30) for i in range(30)}
        cut = [lg["start"] for lg in ledgers_of(etcd.endpoint, log) if lg.get("start")][-1]
        nodes["n1"].kill()  # the owner: another node takes the bundle over from the cut
        got = _pull_all(sub, name, kept | backlog)
        assert kept | backlog <= set(got), f"{len((kept | backlog) - set(got))} acknowledged publishes lost"
        assert not early & set(got), "acknowledged messages came back"

        st = await_status(etcd.endpoint, lambda st: str(log - 1) in st["owners"]
                          and st["owners"][str(log - 1)] != "n1", what="a new owner")
        owner = st["owners"][str(log - 1)]
        text = open(tmp_path / f"{owner}.log").read()
        took = re.findall(rf"took bundle {log - 1} over at epoch \d+: (\d+) entries \(.*?\) from (\d+) to (\d+)",
                          text)
        assert took, "the new owner says what it read"
        entries, start, end = map(int, took[-1])
        # it read the log from the latest cut (a snapshot: at least where the old owner had cut it before the kill,
        # never from the start) to the end recovery found, every entry between: the snapshot on, not the backlog.
        # (The list itself may have moved on since: the new owner writes a snapshot at once, rolls and cuts.)
        assert 0 < cut <= start and entries == end - start < end, (took, cut)
    finally:
        for n in nodes.values():
            n.kill()
