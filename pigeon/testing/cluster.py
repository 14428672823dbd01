"""A cluster of real `pigeon serve --etcd …` processes on loopback (tests, `make cluster`, fault runs), and a
reader of its state straight from etcd (its endpoints, or an EtcdAccess for an etcd that takes TLS)."""

from __future__ import annotations

import asyncio
import os
import time

from pigeon.cluster import metadata as M
from pigeon.ops.etcd_access import EtcdAccess
from pigeon.testing.server import ServerProcess


def node_process(root: str, etcd: str, node_id: str, zone: str = "", extra: list[str] | None = None,
                 port: int | None = None, env: dict[str, str] | None = None, http: bool = False,
                 cwd: str | None = None) -> ServerProcess:
    flags = ["--etcd", etcd, "--node-id", node_id, *(["--zone", zone] if zone else []), *(extra or [])]
    return ServerProcess(os.path.join(root, node_id), port=port, extra=flags,
                         log_path=os.path.join(root, f"{node_id}.log"), env=env, http=http, cwd=cwd)


def start_nodes(root: str, etcd: str, ids=("n1", "n2", "n3"), env: dict[str, str] | None = None,
                http: bool = False) -> dict[str, ServerProcess]:
    """Start nodes of one cluster on a wiped key space and wait until each owns a share of the bundles."""
    wipe(etcd)
    started = {i: node_process(root, etcd, i, env=env, http=http).start() for i in ids}
    await_status(etcd, lambda st: st["unowned"] == 0 and len(st["nodes"]) == len(ids)
                 and all(r["bundles"] for r in st["nodes"]))
    return started


def topic_owned_by(owner_of: dict[int, str], node: str, prefix: str, bundles: int = 16) -> str:
    """A topic name whose bundle `node` owns (`owner_of`: bundle → node, as `owners` reads it)."""
    from pigeon.core.bundles import bundle_of

    for i in range(10_000):
        name = f"{prefix}-{i}"
        if owner_of.get(bundle_of(name, bundles)) == node:
            return name
    raise AssertionError(f"no topic name found for {node}")


async def _status(endpoint: str | EtcdAccess) -> dict:
    from pigeon.node.membership import status_of
    from pigeon.node.meta_etcd import EtcdMetadata

    meta = EtcdMetadata(endpoint)
    try:
        return await status_of(meta)
    finally:
        await meta.close()


def status(endpoint: str | EtcdAccess) -> dict:
    """What `pigeon cluster status --format json` prints."""
    return asyncio.run(_status(endpoint))


def await_status(endpoint: str | EtcdAccess, ok, timeout: float = 30.0,
                 what: str = "the cluster to settle") -> dict:
    """Poll the cluster's status until `ok(status)`; AssertionError (with the last status) after `timeout`. An etcd
    that does not answer one poll (a loaded machine: its first connection timed out) is polled again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = status(endpoint)
        except M.StoreUnavailable as e:
            st = f"unknown ({e})"
        else:
            if ok(st):
                return st
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; the cluster is at {st}")
        time.sleep(0.1)


def wipe(endpoint: str | EtcdAccess) -> None:
    """Delete every key of Pigeon in etcd (a test's fresh start on a shared etcd)."""
    from pigeon.node.meta_etcd import EtcdMetadata

    async def go():
        meta = EtcdMetadata(endpoint)
        try:
            for kv in await meta.list(M.ROOT + "/"):
                await meta.delete(kv.key)
        finally:
            await meta.close()

    asyncio.run(go())


def owners(endpoint: str | EtcdAccess) -> dict[int, str]:
    """bundle → the node that owns it now."""
    from pigeon.node.membership import Membership, NodeInfo
    from pigeon.node.meta_etcd import EtcdMetadata

    async def go():
        meta = EtcdMetadata(endpoint)
        try:
            return {b: n for b, (n, _) in (await Membership(meta, NodeInfo("-", "-")).owners()).items()}
        finally:
            await meta.close()

    return asyncio.run(go())


def settled_owners(endpoint: str | EtcdAccess, bundles: int = 16, timeout: float = 30.0) -> dict[int, str]:
    """`owners` once every bundle has one and two reads half a second apart agree: while nodes join, placement
    still moves bundles for a moment after each owns some (a bundle between two owners has none)."""
    deadline = time.monotonic() + timeout
    last = owners(endpoint)
    while True:
        time.sleep(0.5)
        now = owners(endpoint)
        if now == last and len(now) == bundles:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for the bundles' owners to settle; they are at {now}")
        last = now


def ledgers_of(endpoint: str | EtcdAccess, log: int) -> list[dict]:
    """The ledger list of one bundle log, as etcd holds it."""
    import json

    from pigeon.node.meta_etcd import EtcdMetadata

    async def go():
        meta = EtcdMetadata(endpoint)
        try:
            kv = await meta.get(M.ledgers_key(log))
            return json.loads(kv.value) if kv else []
        finally:
            await meta.close()

    return asyncio.run(go())


def open_ledgers(endpoint: str | EtcdAccess) -> dict[int, list[str]]:
    """log → the members of its open ledger (logs whose last ledger is open)."""
    from pigeon.cluster.ledgers import LedgerInfo
    from pigeon.node.meta_etcd import EtcdMetadata

    async def go():
        meta = EtcdMetadata(endpoint)
        try:
            out = {}
            for kv in await meta.list(M.ROOT + "/ledgers/"):
                ledgers = LedgerInfo.decode_list(kv.value)
                if ledgers and ledgers[-1].end is None:
                    out[int(kv.key.rsplit("/", 1)[-1])] = list(ledgers[-1].members)
            return out
        finally:
            await meta.close()

    return asyncio.run(go())


def clients_of(node):
    """(publisher, subscriber) official clients of one node."""
    from google.cloud import pubsub_v1

    return made_for(node.address, pubsub_v1.PublisherClient), made_for(node.address, pubsub_v1.SubscriberClient)


def made_for(address: str, make):
    """`make()` — an official client — for the node at `address`: the clients read PUBSUB_EMULATOR_HOST when made
    (on the main thread, or one at a time); the variable is left as it was."""
    saved = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = address
    try:
        return make()
    finally:
        if saved is None:
            del os.environ["PUBSUB_EMULATOR_HOST"]
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = saved


def stop_subscriber(future) -> None:
    """End a subscriber the official client runs (its StreamingPull future) and wait until it has."""
    future.cancel()
    try:
        future.result(timeout=30)
    except Exception:  # noqa: BLE001 — cancelled, as asked
        pass


class RawStream:
    """One StreamingPull through the official client's generated method (no reopen of its own, unlike
    `subscribe`): every message id it delivered, each acked on the stream as it came, and what ended it before
    `close()` (the official subscriber would open it again unseen; a test of a stream that must not end reads
    `ended`)."""

    def __init__(self, subscriber, subscription: str, max_messages: int = 20, ack_deadline_s: int = 10):
        import queue
        import threading

        from google.pubsub_v1.types import StreamingPullRequest

        self.got: set[str] = set()
        self.ended: list = []
        self._acks: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()

        def requests():
            yield StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=ack_deadline_s,
                                       max_outstanding_messages=max_messages)
            while not self._stop.is_set():
                try:
                    yield StreamingPullRequest(ack_ids=self._acks.get(timeout=0.1))
                except queue.Empty:
                    continue

        self._stream = subscriber.streaming_pull(requests=requests(), timeout=300)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for resp in self._stream:
                with self._lock:
                    self.got.update(m.message.message_id for m in resp.received_messages)
                if resp.received_messages:
                    self._acks.put([m.ack_id for m in resp.received_messages])
        except Exception as e:  # noqa: BLE001 — the stream's end: close()'s cancel, or a failure
            if not self._stop.is_set():
                self.ended.append(e)
        else:
            self.ended.append("the server ended the stream")

    def received(self) -> set[str]:
        with self._lock:
            return set(self.got)

    def wait_for(self, ids, timeout: float) -> set[str]:
        """Until every id of `ids` arrived, the stream ended or `timeout` passed: the ids still missing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.ended and not set(ids) <= self.received():
            time.sleep(0.1)
        return set(ids) - self.received()

    def close(self) -> None:
        self._stop.set()
        self._stream.cancel()
        self._reader.join(10)
