"""The network and the metadata store of the cluster simulator: the node's real code calls them where it would
call gRPC peers and etcd, and they answer after a delay the seed chooses — or never (a cut link: a pulled cable,
calls wait for their deadlines), or at once with a refusal (a node that is down: nothing listens).

  * `SimNet`: which nodes are up, which links are cut (one way or both), how long a message takes;
  * `SimStorageClient`: a peer's storage service as an owner calls it (node.replication.StorageClient's calls),
    served by that peer's real LedgerStore through the real Append pipeline (node.append_channel.serve_appends)
    and the real Append stream's batching and window (node.append_streams.AppendStream);
  * `SimMeta`: one node's view of the one metadata store (node.meta_local.LocalMetadata on the virtual clock:
    sessions that expire, CAS, watches), with delays, outages of the whole store and cuts of one node from it.
    While the whole store is down no lease runs out, and when it comes back every lease starts its time to live
    again — as etcd renews leases when a new leader takes over."""

from __future__ import annotations

import asyncio
import random

import grpc

from pigeon.cluster.metadata import StoreUnavailable
from pigeon.core import limits
from pigeon.core.errors import PigeonError
from pigeon.node import append_wire
from pigeon.node.append_channel import serve_appends
from pigeon.node.meta_local import LocalMetadata
from pigeon.node.proto import pigeon_storage_pb2 as pb
from pigeon.node.append_streams import AppendStream
from pigeon.testing.simloop import Channel, deadline, sleep



def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class SimNet:
    def __init__(self, rng: random.Random, delay_s: tuple[float, float] = (0.0002, 0.002)):
        self.rng, self.delay_s = rng, delay_s
        self.nodes: dict[str, object] = {}  # node id → its SimNode (what serves at its address)
        self.by_address: dict[str, str] = {}  # address → node id
        self.down: set[str] = set()  # nodes whose process is gone: connections to them are refused
        self.cut: set[tuple[str, str]] = set()  # (from, to): messages that way are lost
        self.meta_cut: set[str] = set()  # nodes that cannot reach the metadata store
        self.meta_down = False  # the whole metadata store is down
        self.generation: dict[str, int] = {}  # node id → how many times it started: a restart breaks old streams
        self._random = rng.random

    def delay(self) -> float:
        """rng.uniform(*delay_s), without its frame (every message takes one): the same number."""
        lo, hi = self.delay_s
        return lo + (hi - lo) * self._random()

    def reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.cut

    def isolate(self, node: str, from_meta: bool = True) -> None:
        for other in self.nodes:
            if other != node:
                self.cut |= {(node, other), (other, node)}
        if from_meta:
            self.meta_cut.add(node)

    def heal(self) -> None:
        self.cut.clear()
        self.meta_cut.clear()

    async def call(self, src: str, dst: str, fn):
        """`await fn()` on `dst` as a unary call from `src`: refused at once when `dst` is down, never answered
        (the deadline passes) across a cut, else answered after the network's delays."""
        if dst in self.down:
            await sleep(self.delay())
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"connection to {dst} refused")
        if not self.reachable(src, dst):
            await sleep(limits.storage_call_s)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        gen = self.generation.get(dst, 0)
        await sleep(self.delay())
        if dst in self.down or self.generation.get(dst, 0) != gen:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{dst} went away")
        try:  # (the caller's deadline holds while the member works: one that crashes meanwhile never answers)
            async with deadline(limits.storage_call_s):  # (no task of its own, as wait_for would make)
                out = await fn()
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except PigeonError as e:
            raise rpc_error(grpc.StatusCode[e.code], e.message) from None
        if not self.reachable(dst, src):
            await sleep(limits.storage_call_s)
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        await sleep(self.delay())
        return out

    def refuses(self, dst: str) -> bool:
        return dst in self.down


class SimStorageClient:
    """One peer's storage service seen from `src` (node.replication.StorageClient's calls)."""

    def __init__(self, net: SimNet, src: str, address: str):
        self.net, self.src, self.address = net, src, address
        self.append_at = ""

    @property
    def dst(self) -> str:
        return self.net.by_address[self.address]

    def _store(self):
        return self.net.nodes[self.dst].store

    def open_append(self, channel: bool = False) -> "SimAppendStream":
        return SimAppendStream(self)

    async def fence(self, ledger: int) -> int:
        return await self.net.call(self.src, self.dst, lambda: self._store().fence(ledger))

    async def read(self, ledger: int, start: int, end: int) -> list[tuple[int, bytes]]:
        async def read():  # (as api.storage_api's Read)
            got = await self._store().read_warm(ledger, start, end, limits.storage_message_bytes_max)
            return [(e.rtype, e.body) for e in got]
        return await self.net.call(self.src, self.dst, read)

    async def answers(self, timeout: float) -> bool:
        async def nothing():
            return True
        try:
            async with deadline(timeout):
                return await self.net.call(self.src, self.dst, nothing)
        except (grpc.aio.AioRpcError, TimeoutError):
            return False

    async def delete(self, ledgers: list[int]) -> int:
        return await self.net.call(self.src, self.dst, lambda: self._store().delete(ledgers))

    async def shard_in(self, shard_out: bytes) -> None:
        from pigeon.storage import records as R

        out = R.ShardOut.decode(shard_out)
        await self.net.call(self.src, self.dst, lambda: self.net.nodes[self.dst].cluster.handovers.accept(out))

    async def close(self) -> None:
        pass


class SimAppendStream(AppendStream):
    """node.append_streams.AppendStream (its queue, batches and window) over the simulated network: each request
    reaches the member's real Append pipeline after the link's delay, each answer comes back after it. A member
    that is down refuses the stream; one that goes down (or restarts) ends it; a cut link loses what crosses it
    (the writer's silence watch then fails the member)."""

    def _open(self, client: SimStorageClient) -> None:
        self.client = client
        net, dst = client.net, client.dst
        self._answers = Channel()
        self.call = self  # (AppendStream.close cancels its call)
        self._inbox = Channel()  # requests as they reach the member
        self._last = {"up": 0.0, "down": 0.0}  # when the latest message each way arrives: a stream keeps order
        self._gen = net.generation.get(dst, 0)
        self._tasks = [asyncio.get_running_loop().create_task(self._carry()),
                       asyncio.get_running_loop().create_task(self._serve())]

    def _alive(self) -> bool:
        net, dst = self.client.net, self.client.dst
        return dst not in net.down and net.generation.get(dst, 0) == self._gen

    def _send(self, way: str, queue: Channel, item) -> None:
        """`item` into `queue` after the link's delay, never before what went the same way before it (one HTTP/2
        stream delivers in order: a member that got entries out of order would refuse them as gaps)."""
        loop = asyncio.get_running_loop()
        at = self._last[way] = max(loop.time() + self.client.net.delay(), self._last[way])
        loop.call_at(at, queue.put_nowait, item)

    async def _carry(self) -> None:
        """The requests, one by one, to the member (lost across a cut; the stream ends if the member is gone)."""
        net, src, dst = self.client.net, self.client.src, self.client.dst
        try:
            async for raw in self._requests():
                if not self._alive():
                    break
                if net.reachable(src, dst):
                    self._send("up", self._inbox, bytes(raw))
        finally:
            self._send("up", self._inbox, None)

    async def _requests_at_member(self):
        while (raw := await self._inbox.get()) is not None:
            if not self._alive():
                return
            yield raw

    async def _serve(self) -> None:
        """The member's side: its real pipeline; every answer back across the link."""
        net, src, dst = self.client.net, self.client.src, self.client.dst
        try:
            if not self._alive():
                raise ConnectionRefusedError(dst)
            store = net.nodes[dst].store
            async for ledger, index, why in serve_appends(store, self._requests_at_member(), "grpc"):
                if not self._alive():
                    break
                if net.reachable(dst, src):
                    self._send("down", self._answers, pb.AppendResponse(ledger=ledger, index=index, error=why))
        except (ConnectionRefusedError, PigeonError) as e:
            self.why_ended = f"{dst}: {e}"
        except asyncio.CancelledError:
            raise
        finally:
            self._send("down", self._answers, None)

    def _encode(self, ledger: int, epoch: int, index: int, types: list[int], entries: list) -> bytes:
        return append_wire.encode(ledger, epoch, index, types, entries)

    async def answers(self):
        while (r := await self._answers.get()) is not None:
            yield self._answered(r)
        self.why_ended = getattr(self, "why_ended", "the member ended its stream")

    def cancel(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._answers.put_nowait(None)


class SimMeta:
    """One node's view of the shared metadata store, over the simulated network."""

    def __init__(self, net: SimNet, store: LocalMetadata, node: str):
        self.net, self.store, self.node = net, store, node

    async def _reach(self) -> None:
        net = self.net
        if net.meta_down:
            await sleep(net.delay())
            raise StoreUnavailable("etcd cannot be reached (simulated: every member is down)")
        if self.node in net.meta_cut:
            await sleep(limits.etcd_call_s)
            raise StoreUnavailable("etcd cannot be reached (simulated: this node is cut off from it)")
        await sleep(net.delay())

    async def _call(self, fn, *args):
        """`fn(*args)` at the store: after the way there, before the way back (either may be lost)."""
        net = self.net
        if net.meta_down or self.node in net.meta_cut:
            await self._reach()  # (which fails)
        else:  # (_reach's way there, without its coroutine: every metadata call of every node comes here)
            await sleep(net.delay())
        out = await fn(*args)
        if self.node in net.meta_cut or net.meta_down:  # the answer is lost on its way back
            await sleep(limits.etcd_call_s)
            raise StoreUnavailable("etcd's answer did not come back (simulated)")
        await sleep(net.delay())
        return out

    # (each call is `_call`'s coroutine itself, handed back to be awaited: not a coroutine of its own around it —
    # every node makes some thousands of metadata calls a seed)
    def get(self, key):
        return self._call(self.store.get, key)

    def list(self, prefix):
        return self._call(self.store.list, prefix)

    def revision(self):
        return self._call(self.store.revision)

    def compact(self, revision):
        return self._call(self.store.compact, revision)

    def txn(self, compares, success, failure=()):
        return self._call(self.store.txn, compares, success, failure)

    def put(self, key, value, lease=0):
        return self._call(self.store.put, key, value, lease)

    def delete(self, key):
        return self._call(self.store.delete, key)

    def grant(self, ttl_s):
        return self._call(self.store.grant, ttl_s)

    def keepalive(self, lease):
        return self._call(self.store.keepalive, lease)

    def revoke(self, lease):
        return self._call(self.store.revoke, lease)

    async def watch(self, prefix, start_revision):
        await self._reach()
        async for ev in self.store.watch(prefix, start_revision):
            if self.node in self.net.meta_cut or self.net.meta_down:
                raise StoreUnavailable("the watch broke (simulated)")
            await sleep(self.net.delay())
            yield ev

    async def close(self) -> None:
        pass
