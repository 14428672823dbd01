"""Membership and ownership (pigeon.node.membership) on both metadata stores — the embedded one and a real etcd:
one live node per id, one cluster per data directory, every node computes the same placement, a bundle has one
owner at a time with epochs that only go up, and a node's keys go when its session ends."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import pytest

from pigeon.cluster import metadata as M
from pigeon.node.membership import MetaView, Membership, NodeIdTaken, NodeInfo, OtherCluster, cluster_id, status_of
from pigeon.node.meta_etcd import EtcdMetadata
from pigeon.node.meta_local import LocalMetadata

TTL = 2
_runs = itertools.count()


@pytest.fixture(params=["embedded", "etcd"])
def make_store(request):
    """Stores that see one another (one etcd; one embedded store shared by the 'nodes' of a test); each etcd test
    gets a fresh key space by wiping /pigeon/ first."""
    if request.param == "embedded":
        shared = LocalMetadata()
        return lambda: shared
    endpoint = request.getfixturevalue("etcd").endpoint

    async def wipe():
        m = EtcdMetadata(endpoint)
        for kv in await m.list(M.ROOT + "/"):
            await m.delete(kv.key)
        await m.close()

    asyncio.run(wipe())
    return lambda: EtcdMetadata(endpoint)


def node(make_store, node_id: str, zone: str = "") -> Membership:
    return Membership(make_store(), NodeInfo(node_id, f"127.0.0.1:{9000 + int(node_id[1:])}", zone), TTL)


def test_a_second_node_with_the_same_id_is_refused(make_store):
    async def run():
        a, twin = node(make_store, "n1"), node(make_store, "n1")
        await a.join()
        with pytest.raises(NodeIdTaken, match="node id n1 is in use by a live node at 127.0.0.1:9001"):
            await twin.join()
        await a.leave()
        await twin.join()  # once the first has left, the id is free
        await twin.leave()

    asyncio.run(run())


def test_a_data_directory_of_another_cluster_is_refused(make_store):
    async def run():
        meta = make_store()
        first = await cluster_id(meta, None)
        assert await cluster_id(meta, first) == first
        assert await cluster_id(meta, None) == first, "a fresh data directory joins the cluster there is"
        with pytest.raises(OtherCluster, match="belongs to cluster elsewhere"):
            await cluster_id(meta, "elsewhere")

    asyncio.run(run())


def test_every_node_computes_the_same_placement_and_one_owner_per_bundle(make_store):
    async def run():
        nodes = [node(make_store, f"n{i}") for i in range(3)]
        for n in nodes:
            await n.join()
        maps = [await n.placement(16) for n in nodes]
        assert maps[0] == maps[1] == maps[2] and set(maps[0].values()) == {"n0", "n1", "n2"}
        # every node races for every bundle: each bundle gets exactly one owner, at epoch 1
        results = await asyncio.gather(*[n.claim(b) for b in range(16) for n in nodes])
        won = [r for r in results if r is not None]
        assert len(won) == 16 and set(won) == {1}
        owners = {b: (await nodes[0].owner(b))[0] for b in range(16)}
        assert all(b in next(n for n in nodes if n.info.node_id == owners[b]).owned for b in range(16))
        # giving a bundle up lets another take it, at a higher epoch
        holder = next(n for n in nodes if 5 in n.owned)
        other = next(n for n in nodes if n is not holder)
        assert await holder.release(5)
        assert await other.claim(5) == 2
        for n in nodes:
            await n.leave()

    asyncio.run(run())


def test_a_node_that_says_it_is_cut_off_gets_no_bundles_until_it_says_otherwise(make_store):
    async def run():
        nodes = [node(make_store, f"n{i}") for i in range(3)]
        for n in nodes:
            await n.join()
        await nodes[0].say_cut_off(True)
        maps = [await n.placement(16) for n in nodes]
        assert maps[0] == maps[1] == maps[2] and set(maps[0].values()) == {"n1", "n2"}
        assert (await nodes[1].members())["n0"].cut_off
        states = {r["node"]: r["state"] for r in (await status_of(nodes[1].meta))["nodes"]}
        assert states == {"n0": "cut off", "n1": "up", "n2": "up"}
        await nodes[0].say_cut_off(False)
        assert set((await nodes[2].placement(16)).values()) == {"n0", "n1", "n2"}
        for n in nodes:
            await n.leave()

    asyncio.run(run())


def test_a_node_gets_no_bundles_before_it_listens(make_store):
    """Killed while starting, a node's peers could not tell it died (a refused connection proves nothing before it
    listened): bundles given to it then would wait for its session to run out."""
    async def run():
        nodes = [node(make_store, f"n{i}") for i in range(3)]
        nodes[0].info = dataclasses.replace(nodes[0].info, listening=False)  # as a cluster node joins
        for n in nodes:
            await n.join()
        maps = [await n.placement(16) for n in nodes]
        assert maps[0] == maps[1] == maps[2] and set(maps[0].values()) == {"n1", "n2"}
        await nodes[0].listening()
        assert set((await nodes[1].placement(16)).values()) == {"n0", "n1", "n2"}
        for n in nodes:
            await n.leave()

    asyncio.run(run())


def test_a_node_whose_session_ends_loses_its_keys_and_its_bundles_are_free(make_store):
    async def run():
        a, b = node(make_store, "n1"), node(make_store, "n2")
        await a.join()
        await b.join()
        assert await a.claim(3) == 1
        a._keeper.cancel()  # a stops keeping its session alive (as if paused or cut off)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while await b.owner(3) is not None:
            assert loop.time() < deadline, "the owner key outlived its session"
            await asyncio.sleep(0.2)
        assert set(await b.members()) == {"n2"}
        assert await b.claim(3) == 2, "the next owner's epoch is above the last one's"
        await b.leave()

    asyncio.run(run())


def test_placement_reads_nodes_and_owners_from_the_watched_view_and_from_the_store_when_it_breaks(make_store):
    """A node keeps the nodes, drain marks and owner keys by a watch: a change made by another node shows in its
    reads once the watch reported it, without a list from the store; with the watch broken, reads list from the
    store again (and so see what changed meanwhile, or learn that it cannot be reached)."""
    lists = []

    async def run():
        a, b = node(make_store, "n1"), node(make_store, "n2")
        meta = a.meta
        real_list = meta.list

        async def counted(prefix):
            lists.append(prefix)
            return await real_list(prefix)
        meta.list = counted
        await a.join()
        seen = asyncio.Event()

        async def follow():
            async for ev in a.view.follow(meta, M.ROOT + "/"):
                if ev.kv.key == M.node_key("n2"):
                    seen.set()
        watching = asyncio.create_task(follow())
        while not a.view.live:
            await asyncio.sleep(0.01)
        loaded = len(lists)
        await b.join()
        await asyncio.wait_for(seen.wait(), 5)
        assert set(await a.members()) == {"n1", "n2"}
        assert await a.claim(3) is not None
        while 3 not in await a.owners():  # (the watch reports the claim)
            await asyncio.sleep(0.01)
        assert len(lists) == loaded, "reads came from the store while the view was live"
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        assert not a.view.live
        await b.leave()
        assert set(await a.members()) == {"n1"}, "with the watch broken, a read sees the store as it is now"
        assert len(lists) > loaded
        await a.leave()

    asyncio.run(run())


def test_the_view_goes_live_on_a_store_that_changes_while_it_lists_and_holds_what_the_store_holds(make_store):
    """On a busy store the revision moves between any two reads (ledger lists, sessions, owner keys): the view
    still goes live, and then holds exactly what the store holds — a change the lists showed already is not
    applied again over a later one, and a key put and deleted before its prefix was listed does not come back."""
    views = []

    async def run():
        a, b = node(make_store, "n1"), node(make_store, "n2")
        meta = a.meta
        await a.join()
        await b.join()
        assert await b.claim(1) == 1
        real_list = meta.list
        once = set()

        async def busy(prefix):
            await b.meta.put(M.ledgers_key(7), prefix.encode())  # a change outside the view before every list
            if prefix == M.drain_key("") and prefix not in once:  # a drain mark that came and went before its
                await b.meta.put(M.drain_key("n9"), b"")            # prefix was listed
                await b.meta.delete(M.drain_key("n9"))
            if prefix == M.owner_key(0)[:-5] and prefix not in once:  # an owner key given up and taken again
                assert await b.release(1)                                 # before owners were listed
                assert await b.claim(1) == 2
            once.add(prefix)
            return await real_list(prefix)
        meta.list = busy

        async def follow():  # (the store is quiet once the lists are taken: every live view must be its last state)
            async for ev in a.view.follow(meta, M.ROOT + "/"):
                if a.view.live:
                    views.append({p: {k: kv.value for k, kv in a.view.kvs[p].items()} for p in MetaView.PREFIXES})
                if ev.kv.mod_revision >= await meta.revision() and views:
                    return
        await asyncio.wait_for(follow(), 5)
        meta.list = real_list
        held = {p: {kv.key: kv.value for kv in await meta.list(p)} for p in MetaView.PREFIXES}
        assert views and all(v == held for v in views), (views, held)
        assert await a.owners() == {1: ("n2", 2)} and await a.draining() == set()
        await a.leave()
        await b.leave()

    asyncio.run(run())


def _kv(key: str, value: bytes, rev: int) -> M.KV:
    return M.KV(key, value, rev, rev)


def test_the_view_skips_a_change_older_than_the_one_it_holds():
    """The lists are taken after the watch's starting point: the watch reports again changes they hold (and
    deletes of keys they hold as put again later); only a change newer than the view's takes."""
    view = MetaView()
    key = M.owner_key(1)
    p = M.owner_key(0)[:-5]
    view.kvs[p][key] = _kv(key, b"listed", 10)
    view.apply(M.Event("put", _kv(key, b"older", 8)))
    view.apply(M.Event("delete", _kv(key, b"", 9)))
    view.apply(M.Event("put", _kv(key, b"listed", 10)))
    assert view.kvs[p][key].value == b"listed"
    view.apply(M.Event("put", _kv(key, b"newer", 11)))
    assert view.kvs[p][key].value == b"newer"
    view.apply(M.Event("delete", _kv(key, b"", 12)))
    assert key not in view.kvs[p]
    view.apply(M.Event("put", _kv(key, b"again", 13)))
    assert view.kvs[p][key].value == b"again"


def test_a_join_takes_a_key_its_own_new_session_already_holds(make_store):
    """A rejoin may find the node's key already written under the session it was just granted (`listening`, said
    meanwhile, writes it under the current session): that key is its own — ending the session that holds it, as
    for a key of the node's earlier life, would end the new session too."""
    async def run():
        a = node(make_store, "n1")
        a.info = dataclasses.replace(a.info, home="home-1")
        meta = a.meta
        real_txn = meta.txn

        async def listening_first(compares, success, failure=()):
            meta.txn = real_txn
            await a.listening()
            return await real_txn(compares, success, failure)

        meta.txn = listening_first
        await a.join()
        kv = await meta.get(M.node_key("n1"))
        assert kv is not None and kv.lease == a.lease and NodeInfo.decode("n1", kv.value).listening
        await meta.keepalive(a.lease)  # the session lives
        await a.leave()

    asyncio.run(run())


def test_a_session_outlives_a_busy_loop_but_not_a_stalled_one(etcd):
    """On etcd the keepalives come from a thread of their own (node.meta_etcd.SessionKeeper): a loop that holds the
    GIL in runs of computation (and so fires no timer) for longer than the time to live keeps its session, while a
    loop that does not run at all past limits.session_stall_s lets it end."""
    import time

    from pigeon.core import limits

    async def run():
        meta = EtcdMetadata(etcd.endpoint)
        for kv in await meta.list(M.ROOT + "/"):
            await meta.delete(kv.key)
        a = Membership(meta, NodeInfo("n1", "127.0.0.1:9001"), TTL)
        await a.join()
        await asyncio.sleep(0.1)  # (its keeper starts)
        end = time.monotonic() + 1.5 * TTL  # busy: no await for longer than the session lives
        while time.monotonic() < end:
            sum(range(10_000))
        await asyncio.sleep(0.5)
        assert not a.lost.is_set() and await meta.get(M.node_key("n1")) is not None
        time.sleep(limits.session_stall_s + 2 * TTL)  # the loop stalled: the thread stops renewing
        assert await meta.get(M.node_key("n1")) is None
        await asyncio.wait_for(a.lost.wait(), 5)  # … and the node hears its session ended
        await a.leave()
        await meta.close()

    asyncio.run(run())
