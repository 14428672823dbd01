"""The metadata interface (pigeon.cluster.metadata) on etcd 3, through the gRPC stubs of the `aetcd` package (a
maintained asyncio etcd client whose generated code works with this project's protobuf and grpcio): KV Range,
Txn, Put and DeleteRange, leases, and one Watch stream per watch. Endpoints are tried in turn; a call that
cannot reach any raises StoreUnavailable naming them (and, over TLS, saying that a refused certificate looks the
same). `_connect` is the one place a channel to etcd is made: plaintext, or TLS with the material of an
EtcdAccess (pigeon.ops.etcd_access owns which).

Many tasks share the channel (placement, every log's roll, the session's keepalive, the watch). Leaving a channel
that failed never closes it under the others: grpc.aio cancels the calls of a channel it closes, and a call
cancelled that way raises CancelledError in its caller — which reads as "this task was asked to stop" and ended
a node's placement loop for good once (a chaos run: an owner cut off from etcd never gave its bundles up after
the cut healed). The old channel is closed once every call on it has had its own deadline; a call that still
ends in CancelledError without its task being cancelled counts as etcd not answering."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
from aetcd import rpc

from pigeon.core import limits
from pigeon.cluster.metadata import KV, Cmp, Delete, Event, LeaseGone, Op, Put, StoreUnavailable
from pigeon.ops import etcd_access, tls
from pigeon.ops.etcd_access import EtcdAccess

_TARGET = {"value": rpc.Compare.VALUE, "mod": rpc.Compare.MOD, "create": rpc.Compare.CREATE}
_RESULT = {"==": rpc.Compare.EQUAL, "!=": rpc.Compare.NOT_EQUAL, "<": rpc.Compare.LESS, ">": rpc.Compare.GREATER}
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _tls_hint(details: str) -> str:
    """What a failed TLS handshake most likely means (gRPC says only that the connection failed, in its own words;
    etcd's log names a client certificate it rejected)."""
    if "CERTIFICATE_VERIFY_FAILED" in details or "peer certificate" in details:
        return (" — etcd's certificate is not trusted: --etcd-ca (else the system's roots) must hold the CA that "
                "signed it, and it must name the host dialled")
    if any(w in details for w in ("TSI_", "SSL", "andshake")):
        return (" — the TLS handshake failed: etcd likely refused this client's certificate (--etcd-cert and "
                "--etcd-key, signed by the CA of etcd's --trusted-ca-file, with clientAuth), or it speaks no TLS")
    return ""


def _prefix_end(prefix: bytes) -> bytes:
    """The end of the key range that holds every key starting with `prefix` (etcd's convention)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\0"


def _kv(m) -> KV:
    return KV(m.key.decode(), bytes(m.value), m.create_revision, m.mod_revision, m.lease)


def _op(op: Op):
    if isinstance(op, Put):
        return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease))
    if isinstance(op, Delete):
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key.encode()))
    raise TypeError(f"not a metadata operation: {op!r}")


def _cmp(c: Cmp):
    m = rpc.Compare(key=c.key.encode(), target=_TARGET[c.target], result=_RESULT[c.op])
    if c.target == "value":
        m.value = c.value
    elif c.target == "mod":
        m.mod_revision = c.value
    else:
        m.create_revision = c.value
    return m


@dataclass(frozen=True)
class _Stubs:
    """One channel to one endpoint and the services called on it."""
    channel: grpc.aio.Channel
    kv: rpc.KVStub
    lease: rpc.LeaseStub
    watcher: rpc.WatchStub


def _cancelled_under_us() -> bool:
    """A call ended in CancelledError though nobody cancelled the task awaiting it: its channel was closed."""
    task = asyncio.current_task()
    return task is not None and not task.cancelling()


async def _close_later(channel: grpc.aio.Channel) -> None:
    """Close a channel no new call takes once the calls on it have had their deadlines. (Not grpc.aio's own grace:
    a close with grace that is cancelled leaves the channel "closing", and a second close then returns at once
    without ending its calls.)"""
    await asyncio.sleep(limits.etcd_call_s)
    await channel.close()


class SessionKeeper:
    """A session's keepalives sent by a thread of their own, on a channel of their own: a node whose event loop is
    slow for a moment (two cores shared with others) keeps its session, so the session's time to live can be short
    — a node that is stopped (SIGSTOP, a VM paused) or dead is gone within it. One whose loop does not run at all
    for `stall_s` (`beat()`: when it last ran) is let go: the keepalives stop and the session runs out.

    Each renewal's outcome goes to `report` (called on the thread: "ok", "gone" — the lease ended, no more are
    sent — or "unavailable")."""

    def __init__(self, meta: "EtcdMetadata", lease: int, every_s: float, beat, stall_s: float, report):
        self.meta, self.lease, self.every_s, self.beat, self.stall_s, self.report = \
            meta, lease, every_s, beat, stall_s, report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pigeon-session", daemon=True)

    def start(self) -> "SessionKeeper":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        meta, channel, i = self.meta, None, 0
        request = rpc.LeaseKeepAliveRequest(ID=self.lease)
        try:
            while not self._stop.wait(self.every_s):
                if time.monotonic() - self.beat() > self.stall_s:
                    continue  # (the loop does not run: the node serves nothing — let its session end)
                if channel is None:
                    channel = meta.blocking_channel(meta.endpoints[i % len(meta.endpoints)])
                try:
                    got = next(rpc.LeaseStub(channel).LeaseKeepAlive(iter([request]), timeout=self.every_s * 2),
                               None)
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.NOT_FOUND:
                        got = None
                    else:
                        channel.close()
                        channel, i = None, i + 1  # (the next endpoint, next time)
                        self.report("unavailable")
                        continue
                if got is None or got.TTL <= 0:
                    self.report("gone")
                    return
                self.report("ok")
        finally:
            if channel is not None:
                channel.close()


class EtcdMetadata:
    def __init__(self, access: EtcdAccess | str | list[str]):
        """`access`: endpoints and TLS material (pigeon.ops.etcd_access.read), or endpoints alone (https:// ones
        are TLS with the system's roots and no client certificate)."""
        if not isinstance(access, EtcdAccess):
            access = etcd_access.read(access)
        self.access = access
        self.endpoints = list(access.endpoints)
        self._credentials = grpc.ssl_channel_credentials(access.ca, access.key, access.cert) if access.tls else None
        self._i = 0
        self._current: _Stubs | None = None
        self._closing: dict[asyncio.Task, grpc.aio.Channel] = {}  # channels left: closed once their calls ended

    def _connect(self, endpoint: str) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(endpoint, options=tls.reconnect_options())
        return grpc.aio.secure_channel(endpoint, self._credentials, options=tls.reconnect_options())

    def blocking_channel(self, endpoint: str) -> grpc.Channel:
        """A channel for a thread's own calls (SessionKeeper), with this store's TLS material."""
        if self._credentials is None:
            return grpc.insecure_channel(endpoint, options=tls.reconnect_options())
        return grpc.secure_channel(endpoint, self._credentials, options=tls.reconnect_options())

    def session_keeper(self, lease: int, every_s: float, beat, stall_s: float, report) -> SessionKeeper:
        return SessionKeeper(self, lease, every_s, beat, stall_s, report)

    def _stubs(self) -> _Stubs:
        if self._current is None:
            channel = self._connect(self.endpoints[self._i])
            self._current = _Stubs(channel, rpc.KVStub(channel), rpc.LeaseStub(channel), rpc.WatchStub(channel))
        return self._current

    def _unreachable(self, endpoints: list[str], details: str) -> StoreUnavailable:
        where = ", ".join(endpoints)
        if self.access.tls:
            return StoreUnavailable(f"etcd cannot be reached at {where} over TLS: {details}{_tls_hint(details)}")
        hint = " — if etcd takes TLS only, give https:// endpoints" if "Socket closed" in details else ""
        return StoreUnavailable(f"etcd cannot be reached at {where}: {details}{hint}")

    async def _call(self, fn, request):
        """One unary call, on the next endpoint when this one cannot be reached."""
        return await self._on_any_endpoint(lambda stubs: fn(stubs)(request, timeout=limits.etcd_call_s))

    async def _on_any_endpoint(self, call):
        """`await call(stubs)` on this endpoint, on the next one when it cannot be reached."""
        last = "no answer"
        for _ in range(len(self.endpoints)):
            stubs = self._stubs()
            try:
                return await call(stubs)
            except grpc.aio.AioRpcError as e:
                if e.code() not in _UNREACHABLE:
                    if e.code() == grpc.StatusCode.NOT_FOUND and "lease" in (e.details() or ""):
                        raise LeaseGone(e.details()) from None
                    raise
                last = e.details()
            except asyncio.CancelledError:
                if not _cancelled_under_us():
                    raise
                last = "the call was cut short with its channel"
            self._switch(stubs)
        raise self._unreachable(self.endpoints, last)

    def _switch(self, failed: _Stubs) -> None:
        """Go on to the next endpoint, unless another call already left `failed`. Its calls still running end by
        their deadlines (or answers) before it closes."""
        if self._current is not failed:
            return
        self._current = None
        self._i = (self._i + 1) % len(self.endpoints)
        task = asyncio.get_running_loop().create_task(_close_later(failed.channel))
        self._closing[task] = failed.channel
        task.add_done_callback(lambda t: self._closing.pop(t, None))

    # --- reading -------------------------------------------------------------------------------------------
    async def get(self, key: str) -> KV | None:
        r = await self._call(lambda s: s.kv.Range, rpc.RangeRequest(key=key.encode()))
        return _kv(r.kvs[0]) if r.kvs else None

    async def list(self, prefix: str) -> list[KV]:
        p = prefix.encode()
        r = await self._call(lambda s: s.kv.Range, rpc.RangeRequest(key=p, range_end=_prefix_end(p),
                                                                    sort_order=rpc.RangeRequest.ASCEND,
                                                                    sort_target=rpc.RangeRequest.KEY))
        return [_kv(m) for m in r.kvs]

    async def revision(self) -> int:
        r = await self._call(lambda s: s.kv.Range, rpc.RangeRequest(key=b"\0", count_only=True))
        return r.header.revision

    async def compact(self, revision: int) -> None:
        try:
            await self._call(lambda s: s.kv.Compact, rpc.CompactionRequest(revision=revision))
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.OUT_OF_RANGE:  # ("required revision has been compacted")
                raise

    # --- changing ------------------------------------------------------------------------------------------
    async def txn(self, compares: list[Cmp], success: list[Op], failure: list[Op] = ()) -> tuple[bool, int]:
        req = rpc.TxnRequest(compare=[_cmp(c) for c in compares], success=[_op(o) for o in success],
                             failure=[_op(o) for o in failure])
        r = await self._call(lambda s: s.kv.Txn, req)
        return r.succeeded, r.header.revision

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        r = await self._call(lambda s: s.kv.Put, rpc.PutRequest(key=key.encode(), value=value, lease=lease))
        return r.header.revision

    async def delete(self, key: str) -> bool:
        r = await self._call(lambda s: s.kv.DeleteRange, rpc.DeleteRangeRequest(key=key.encode()))
        return r.deleted > 0

    # --- leases --------------------------------------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        r = await self._call(lambda s: s.lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl_s))
        return r.ID

    async def keepalive(self, lease: int) -> None:
        async def once(stubs):
            call = stubs.lease.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=limits.etcd_call_s)
            async for r in call:
                return r
            return None

        r = await self._on_any_endpoint(once)
        if r is None or r.TTL <= 0:
            raise LeaseGone(f"lease {lease} has ended")

    async def revoke(self, lease: int) -> None:
        try:
            await self._call(lambda s: s.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease))
        except LeaseGone:
            pass

    # --- watching ------------------------------------------------------------------------------------------
    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Event]:
        p = prefix.encode()
        requests: asyncio.Queue = asyncio.Queue()
        requests.put_nowait(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
            key=p, range_end=_prefix_end(p), start_revision=start_revision + 1)))

        async def send():
            while True:
                r = await requests.get()
                if r is None:
                    return
                yield r

        stubs = self._stubs()
        endpoint = self.endpoints[self._i]
        call = stubs.watcher.Watch(send())
        try:
            async for resp in call:
                if resp.canceled:
                    raise ValueError(f"etcd ended the watch of {prefix}: {resp.cancel_reason or 'compacted'}")
                for e in resp.events:
                    yield Event("delete" if e.type == rpc.Event.DELETE else "put", _kv(e.kv))
        except grpc.aio.AioRpcError as e:
            if e.code() in _UNREACHABLE:
                raise self._unreachable([endpoint], e.details()) from None
            raise
        except asyncio.CancelledError:
            if not _cancelled_under_us():
                raise
            raise self._unreachable([endpoint], "the watch was cut short with its channel") from None
        finally:
            requests.put_nowait(None)
            call.cancel()

    async def close(self) -> None:
        if self._current is not None:
            await self._current.channel.close()
            self._current = None
        for task, channel in list(self._closing.items()):
            task.cancel()
            await channel.close()
