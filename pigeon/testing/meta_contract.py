"""The metadata contract (pigeon.cluster.metadata), as checks any store must pass: each takes a fresh, empty store
and raises AssertionError when the store breaks a rule. tests/node/test_metadata.py runs every check against the
embedded store and against a real etcd."""

from __future__ import annotations

import asyncio

from pigeon.cluster.metadata import (Cmp, Delete, LeaseGone, Put, absent, holds, unchanged_since)

LEASE_TTL_S = 2  # etcd's shortest lease with its default timing is about 1.5 s
LEASE_WAIT_S = 8.0  # a lease that is not kept alive must have ended by then


async def _eventually(check, within: float) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {within} s")
        await asyncio.sleep(0.1)


async def puts_gets_and_revisions(m) -> None:
    r0 = await m.revision()
    r1 = await m.put("/t/a", b"1")
    assert r1 == r0 + 1, (r0, r1)
    a = await m.get("/t/a")
    assert (a.value, a.create_revision, a.mod_revision) == (b"1", r1, r1)
    r2 = await m.put("/t/a", b"2")
    a = await m.get("/t/a")
    assert (a.value, a.create_revision, a.mod_revision) == (b"2", r1, r2) and r2 == r1 + 1
    assert await m.get("/t/missing") is None
    assert await m.delete("/t/a") is True
    assert await m.get("/t/a") is None
    assert await m.delete("/t/a") is False
    assert await m.revision() == r2 + 1, "a delete of nothing changes nothing"


async def lists_by_prefix_in_key_order(m) -> None:
    for k in ["/p/b", "/p/a", "/p/c/d", "/q/a", "/pa"]:
        await m.put(k, k.encode())
    assert [kv.key for kv in await m.list("/p/")] == ["/p/a", "/p/b", "/p/c/d"]
    assert await m.list("/none/") == []


async def transactions_compare_and_swap(m) -> None:
    ok, rev = await m.txn([absent("/x")], [Put("/x", b"mine"), Put("/y", b"too")], [Put("/lost", b"1")])
    assert ok
    x, y = await m.get("/x"), await m.get("/y")
    assert x.mod_revision == y.mod_revision == rev, "one revision for the whole transaction"
    ok, _ = await m.txn([absent("/x")], [Put("/x", b"theirs")], [Put("/lost", b"1")])
    assert not ok and (await m.get("/x")).value == b"mine" and (await m.get("/lost")).value == b"1"
    ok, _ = await m.txn([unchanged_since(x), holds("/y", b"too")], [Put("/x", b"swapped"), Delete("/y")])
    assert ok and (await m.get("/x")).value == b"swapped" and await m.get("/y") is None
    ok, _ = await m.txn([unchanged_since(x)], [Put("/x", b"stale")])
    assert not ok and (await m.get("/x")).value == b"swapped", "a stale compare-and-swap must fail"
    ok, _ = await m.txn([Cmp("/x", "mod", ">", 0), Cmp("/x", "value", "!=", b"other")], [])
    assert ok


async def racing_writers_one_wins(m) -> None:
    """Twenty writers each try to take the same key by compare-and-swap: exactly one does."""
    results = await asyncio.gather(*[m.txn([absent("/owner")], [Put("/owner", str(i).encode())])
                                     for i in range(20)])
    winners = [i for i, (ok, _) in enumerate(results) if ok]
    assert len(winners) == 1, winners
    assert (await m.get("/owner")).value == str(winners[0]).encode()


async def leased_keys_go_with_their_lease(m) -> None:
    kept, dropped, revoked = await m.grant(LEASE_TTL_S), await m.grant(LEASE_TTL_S), await m.grant(LEASE_TTL_S)
    await m.put("/l/kept", b"1", lease=kept)
    await m.put("/l/dropped", b"1", lease=dropped)
    await m.put("/l/revoked", b"1", lease=revoked)
    await m.put("/l/plain", b"1")
    assert (await m.get("/l/kept")).lease == kept
    await m.revoke(revoked)
    assert await m.get("/l/revoked") is None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEASE_WAIT_S
    while await m.get("/l/dropped") is not None:
        assert loop.time() < deadline, "a lease nobody kept alive did not end"
        await m.keepalive(kept)
        await asyncio.sleep(0.25)
    assert await m.get("/l/kept") is not None and await m.get("/l/plain") is not None
    try:
        await m.keepalive(dropped)
    except LeaseGone:
        pass
    else:
        raise AssertionError("keeping an ended lease alive must fail")
    try:
        await m.put("/l/late", b"1", lease=dropped)
    except Exception:  # noqa: BLE001 — etcd answers NOT_FOUND, the embedded store LeaseGone: either refuses
        pass
    else:
        raise AssertionError("a put under an ended lease must be refused")


async def watches_see_every_change_in_order(m) -> None:
    start = await m.revision()
    await m.put("/w/a", b"1")
    seen = []

    async def follow():
        async for e in m.watch("/w/", start):
            seen.append((e.kind, e.kv.key, e.kv.value, e.kv.mod_revision))
            if len(seen) == 5:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.2)
    await m.put("/w/b", b"2")
    await m.put("/other", b"x")
    await m.txn([], [Put("/w/a", b"3"), Delete("/w/b")])
    lease = await m.grant(LEASE_TTL_S)
    await m.put("/w/c", b"4", lease=lease)
    await asyncio.wait_for(task, 10)
    kinds = [(k, key, v) for k, key, v, _ in seen]
    assert kinds == [("put", "/w/a", b"1"), ("put", "/w/b", b"2"), ("put", "/w/a", b"3"), ("delete", "/w/b", b""),
                     ("put", "/w/c", b"4")], kinds
    revs = [r for *_, r in seen]
    assert revs == sorted(revs) and revs[2] == revs[3], "in revision order; one transaction, one revision"
    await m.revoke(lease)


async def compaction_forgets_history_not_keys(m) -> None:
    """A watch resumes from a revision kept; one from before a compaction is refused (a follower must list again:
    its history is gone), the keys keep their values, and compacting again is no error."""
    await m.put("/c/a", b"1")
    before = await m.revision()
    await m.put("/c/a", b"2")
    await m.put("/c/b", b"3")
    now = await m.revision()
    await m.compact(now)
    await m.compact(now)
    assert (await m.get("/c/a")).value == b"2" and (await m.get("/c/b")).value == b"3"

    async def first(rev):
        async for e in m.watch("/c/", rev):
            return e.kv.key, e.kv.value

    try:
        await asyncio.wait_for(first(before), 10)
    except ValueError:
        pass
    else:
        raise AssertionError("a watch from a compacted revision was served")
    task = asyncio.create_task(first(now))
    await asyncio.sleep(0.2)
    await m.put("/c/b", b"4")
    assert await asyncio.wait_for(task, 10) == ("/c/b", b"4")


CHECKS = [puts_gets_and_revisions, lists_by_prefix_in_key_order, transactions_compare_and_swap,
          racing_writers_one_wins, leased_keys_go_with_their_lease, watches_see_every_change_in_order,
          compaction_forgets_history_not_keys]
