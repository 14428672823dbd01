"""The metadata contract (pigeon.testing.meta_contract) against both stores: the embedded one and a real etcd
process (Debian's etcd-server, started on free loopback ports), plaintext and secured as production runs it (TLS,
client certificates required). Plus what only one of them has: the embedded store's file across a restart, and
etcd's endpoints failing over and being unreachable."""

from __future__ import annotations

import asyncio
import itertools
import os
import time

import pytest

from pigeon.cluster.metadata import StoreUnavailable
from pigeon.node.meta_etcd import EtcdMetadata
from pigeon.node.meta_local import LocalMetadata
from pigeon.testing import meta_contract
from pigeon.bench.procs import free_port

_prefixes = itertools.count()


@pytest.fixture(params=["embedded", "etcd", "etcd-tls"])
def store_factory(request, tmp_path):
    if request.param == "embedded":
        return lambda: LocalMetadata(str(tmp_path / "meta.json"))
    if request.param == "etcd-tls":
        access = request.getfixturevalue("etcd_tls").access("node-n1")
        return lambda: EtcdMetadata(access)
    endpoint = request.getfixturevalue("etcd").endpoint
    return lambda: EtcdMetadata(endpoint)


class _Scoped:
    """One etcd serves every check: each sees the store under a prefix of its own (revisions are shared, which
    the checks allow for: they compare revisions they read, never absolute ones)."""

    def __init__(self, inner, prefix: str):
        self.inner, self.p = inner, prefix

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _k(self, key):
        return self.p + key

    async def get(self, key):
        kv = await self.inner.get(self._k(key))
        return kv and type(kv)(key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)

    async def list(self, prefix):
        return [type(kv)(kv.key[len(self.p):], kv.value, kv.create_revision, kv.mod_revision, kv.lease)
                for kv in await self.inner.list(self._k(prefix))]

    async def put(self, key, value, lease=0):
        return await self.inner.put(self._k(key), value, lease)

    async def delete(self, key):
        return await self.inner.delete(self._k(key))

    async def txn(self, compares, success, failure=()):
        from dataclasses import replace
        return await self.inner.txn([replace(c, key=self._k(c.key)) for c in compares],
                                    [replace(o, key=self._k(o.key)) for o in success],
                                    [replace(o, key=self._k(o.key)) for o in failure])

    async def watch(self, prefix, start_revision):
        from dataclasses import replace
        async for e in self.inner.watch(self._k(prefix), start_revision):
            yield replace(e, kv=replace(e.kv, key=e.kv.key[len(self.p):]))


@pytest.mark.parametrize("check", meta_contract.CHECKS, ids=lambda c: c.__name__)
def test_contract(store_factory, check):
    async def run():
        store = store_factory()
        try:
            if isinstance(store, EtcdMetadata):
                # revisions are the whole store's: a check's "one more" holds only while nobody else writes
                await check(_Scoped(store, f"/contract-{next(_prefixes)}"))
            else:
                await check(store)
        finally:
            await store.close()

    asyncio.run(run())


def test_the_embedded_store_keeps_its_keys_across_a_restart_but_not_a_sessions(tmp_path):
    path = str(tmp_path / "meta.json")

    async def first():
        m = LocalMetadata(path)
        await m.put("/keep", b"1")
        lease = await m.grant(30)
        await m.put("/session", b"1", lease=lease)
        return await m.revision()

    async def second(rev):
        m = LocalMetadata(path)
        kv = await m.get("/keep")
        assert kv is not None and kv.value == b"1"
        assert await m.get("/session") is None
        assert await m.revision() >= rev - 1
        assert await m.put("/more", b"2") > kv.mod_revision

    asyncio.run(second(asyncio.run(first())))


def test_etcd_endpoints_fail_over_and_an_unreachable_store_says_so(etcd):
    dead = f"127.0.0.1:{free_port()}"

    async def run():
        m = EtcdMetadata(f"http://{dead},http://{etcd.endpoint}")
        await m.put("/failover/k", b"v")
        assert (await m.get("/failover/k")).value == b"v"
        await m.close()
        gone = EtcdMetadata(dead)
        with pytest.raises(StoreUnavailable, match=f"etcd cannot be reached at {dead}"):
            await gone.get("/x")
        await gone.close()

    asyncio.run(run())


def test_a_call_that_leaves_its_channel_lets_the_other_calls_on_it_finish(etcd):
    """Tasks share the channel to etcd: when one call finds etcd unreachable and goes on to the next endpoint, the
    calls the other tasks have on the old channel still end by their own answers. (Closing it at once had grpc.aio
    cancel them: CancelledError in a task nobody stopped, which ended a node's placement loop for good.)"""

    async def run():
        m = EtcdMetadata(etcd.endpoint)
        rev = await m.put("/leave/k", b"v")
        events = []

        async def watch():
            async for e in m.watch("/leave/", rev):
                events.append(e.kv.key)

        watcher = asyncio.create_task(watch())
        gets = [asyncio.create_task(m.get("/leave/k")) for _ in range(20)]
        await asyncio.sleep(0)  # every call is on the wire of the first channel
        m._switch(m._stubs())  # what a call that found this endpoint unreachable does
        assert [kv.value for kv in await asyncio.gather(*gets)] == [b"v"] * 20
        await m.put("/leave/k2", b"w")  # on a channel of its own
        for _ in range(200):
            if events:
                break
            await asyncio.sleep(0.01)
        assert events == ["/leave/k2"]  # the watch on the old channel still sees what changes
        await m.close()
        with pytest.raises(StoreUnavailable, match="cut short with its channel"):
            await watcher  # ended under it: "etcd did not answer", never a cancellation of the watching task

    asyncio.run(run())


def _refused_access(etcd_tls, other_pki: str, case: str):
    from pigeon.ops import etcd_access

    ca, node = etcd_tls.pki_file("ca"), etcd_tls.pki_file("node-n1")
    key = etcd_tls.pki_file("node-n1-key")
    foreign, foreign_key = os.path.join(other_pki, "node-n1.pem"), os.path.join(other_pki, "node-n1-key.pem")
    return {
        "no client certificate": lambda: etcd_access.read(etcd_tls.url, ca),
        "a certificate of another CA": lambda: etcd_access.read(etcd_tls.url, ca, foreign, foreign_key),
        "etcd's certificate not from --etcd-ca": lambda: etcd_access.read(etcd_tls.url, os.path.join(other_pki,
                                                                                                      "ca.pem"),
                                                                          node, key),
        "the system's roots": lambda: etcd_access.read(etcd_tls.url),
        "plaintext": lambda: etcd_access.read(f"http://{etcd_tls.endpoint}"),
    }[case]()


@pytest.mark.parametrize("case, says", [
    ("no client certificate", "the TLS handshake failed: etcd likely refused this client's certificate"),
    ("a certificate of another CA", "the TLS handshake failed: etcd likely refused this client's certificate"),
    ("etcd's certificate not from --etcd-ca", "etcd's certificate is not trusted"),
    ("the system's roots", "etcd's certificate is not trusted"),
    ("plaintext", "if etcd takes TLS only, give https:// endpoints"),
])
def test_a_client_etcd_does_not_trust_or_that_does_not_trust_etcd_is_told_so_at_once(etcd_tls, tmp_path, case, says):
    from pigeon.ops import certs

    other = str(tmp_path / "other-ca")
    certs.make_ca(other, "another CA")
    certs.issue(other, "node-n1", hosts=["127.0.0.1"], node_id="n1")

    async def run():
        m = EtcdMetadata(_refused_access(etcd_tls, other, case))
        t0 = time.monotonic()
        try:
            with pytest.raises(StoreUnavailable) as e:
                await m.put("/refused/k", b"v")
        finally:
            await m.close()
        return str(e.value), time.monotonic() - t0

    message, took = asyncio.run(run())
    assert message.startswith(f"etcd cannot be reached at {etcd_tls.endpoint}")
    assert says in message
    assert took < 5.0  # one call's timeout (limits.etcd_call_s) at most: a refusal is no hang
