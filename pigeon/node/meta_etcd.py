"""The metadata interface (pigeon.cluster.metadata) on etcd 3, through the gRPC stubs of the `aetcd` package (a
maintained asyncio etcd client whose generated code works with this project's protobuf and grpcio): KV Range,
Txn, Put and DeleteRange, leases, and one Watch stream per watch. Endpoints are tried in turn; a call that
cannot reach any raises StoreUnavailable naming them."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc
from aetcd import rpc

from pigeon.cluster.metadata import KV, Cmp, Delete, Event, LeaseGone, Op, Put, StoreUnavailable

_TARGET = {"value": rpc.Compare.VALUE, "mod": rpc.Compare.MOD, "create": rpc.Compare.CREATE}
_RESULT = {"==": rpc.Compare.EQUAL, "!=": rpc.Compare.NOT_EQUAL, "<": rpc.Compare.LESS, ">": rpc.Compare.GREATER}
_CALL_S = 5.0  # one etcd call
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


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


class EtcdMetadata:
    def __init__(self, endpoints: str | list[str]):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        self.endpoints = [e.strip().removeprefix("http://").removeprefix("https://").rstrip("/") for e in endpoints]
        if not self.endpoints:
            raise ValueError("etcd needs at least one endpoint (host:port)")
        self._i = 0
        self._channel: grpc.aio.Channel | None = None

    def _stubs(self):
        if self._channel is None:
            self._channel = rpc.insecure_channel(self.endpoints[self._i])
            self.kv, self.lease = rpc.KVStub(self._channel), rpc.LeaseStub(self._channel)
            self.watcher = rpc.WatchStub(self._channel)
        return self

    async def _call(self, fn, request):
        """One unary call, on the next endpoint when this one cannot be reached."""
        last = None
        for _ in range(len(self.endpoints)):
            stubs = self._stubs()
            try:
                return await fn(stubs)(request, timeout=_CALL_S)
            except grpc.aio.AioRpcError as e:
                if e.code() not in _UNREACHABLE:
                    if e.code() == grpc.StatusCode.NOT_FOUND and "lease" in (e.details() or ""):
                        raise LeaseGone(e.details()) from None
                    raise
                last = e
                await self._switch()
        raise StoreUnavailable(f"etcd cannot be reached at {', '.join(self.endpoints)}: "
                               f"{last.details() if last else 'no answer'}")

    async def _switch(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        self._i = (self._i + 1) % len(self.endpoints)

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
            call = stubs.lease.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=_CALL_S)
            async for r in call:
                return r
            return None

        for _ in range(len(self.endpoints)):
            try:
                r = await once(self._stubs())
                break
            except grpc.aio.AioRpcError as e:
                if e.code() not in _UNREACHABLE:
                    raise
                await self._switch()
        else:
            raise StoreUnavailable(f"etcd cannot be reached at {', '.join(self.endpoints)}")
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

        call = self._stubs().watcher.Watch(send())
        try:
            async for resp in call:
                if resp.canceled:
                    raise ValueError(f"etcd ended the watch of {prefix}: {resp.cancel_reason or 'compacted'}")
                for e in resp.events:
                    yield Event("delete" if e.type == rpc.Event.DELETE else "put", _kv(e.kv))
        except grpc.aio.AioRpcError as e:
            if e.code() in _UNREACHABLE:
                raise StoreUnavailable(f"etcd cannot be reached at {self.endpoints[self._i]}: {e.details()}") from None
            raise
        finally:
            requests.put_nowait(None)
            call.cancel()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
