"""node.bundle_logs.BundleLogs._read_order: a takeover reads a ledger from this node's own copy first, then from the
members it can count on, and last from those that may hold each read for a call's whole deadline — a member whose
session ended, one that failed a write lately, and one that says it is cut off from its peers (it reaches etcd,
not them: a takeover from such an owner read its log for 10 s, trying it first)."""

from __future__ import annotations

import json
from types import MethodType, SimpleNamespace

from pigeon.cluster import metadata as M
from pigeon.cluster.ledgers import LedgerInfo
from pigeon.node.bundle_logs import BundleLogs


def _logs(records: dict[str, dict], suspected=()):
    view = SimpleNamespace(live=True, kvs={M.node_key(""): {
        M.node_key(n): M.KV(M.node_key(n), json.dumps(d).encode(), 1, 1) for n, d in records.items()}})
    fake = SimpleNamespace(me="n2", cluster=SimpleNamespace(membership=SimpleNamespace(view=view)),
                           suspected=lambda: set(suspected))
    fake._live_nodes = MethodType(BundleLogs._live_nodes, fake)
    return fake


def _order(fake, members) -> list[str]:
    lg = LedgerInfo(7, 1, {m: f"{m}:1" for m in members}, 0)
    return [n for n, _ in BundleLogs._read_order(fake, lg)]


def test_own_copy_first_then_members_it_can_count_on_then_the_rest():
    up = {"address": "x:1"}
    fake = _logs({"n1": {**up, "cut_off": True}, "n2": up, "n3": up, "n4": up}, suspected={"n3"})
    assert _order(fake, ["n1", "n3", "n4", "n2", "n5"]) == ["n2", "n4", "n3", "n1", "n5"]


def test_a_member_cut_off_is_read_after_the_others_even_as_the_ledgers_writer():
    up = {"address": "x:1"}
    assert _order(_logs({"n1": {**up, "cut_off": True}, "n2": up, "n3": up}), ["n1", "n3", "n2"]) == \
        ["n2", "n3", "n1"]
    assert _order(_logs({"n1": up, "n2": up, "n3": up}), ["n1", "n3", "n2"]) == ["n2", "n1", "n3"]
