"""Redis Streams driver (redis-py asyncio with the hiredis parser). Owns the rule: with `appendfsync always`
Redis fsyncs its AOF before it answers, so a pipelined XADD counts once its reply is read; consumption is
XREADGROUP with XACK of what was read, pipelined with the next read. Publish pipelines are packed once before
the clock starts, as Pigeon's requests are."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from importlib.metadata import version

import redis
import redis.asyncio as aredis

from pigeon.bench.workers import open_loop

GROUP = "g"


class RedisDriver:
    supports = frozenset({"publish", "consume", "mixed", "latency", "backlog", "restart"})

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.client = f"redis-py {version('redis')} + hiredis (Python asyncio), pre-packed pipelines"

    def _client(self) -> aredis.Redis:
        # one connection per concurrent command: the open-loop latency publisher may have many in flight
        return aredis.Redis(host=self.host, port=self.port, socket_timeout=60, max_connections=4096)

    async def setup(self, key: str, ordered: bool = False) -> None:
        r = self._client()
        await r.xgroup_create(key, GROUP, id="0", mkstream=True)
        await r.aclose()

    async def serving(self, key: str, expect: int) -> bool:
        r = aredis.Redis(host=self.host, port=self.port, socket_timeout=2, socket_connect_timeout=1)
        try:
            return await r.xlen(key) >= expect
        except (redis.RedisError, OSError):  # BusyLoadingError while the AOF is replayed
            return False
        finally:
            await r.aclose()

    async def publish(self, key: str, size: int, batch: int, inflight: int, gate) -> dict:
        body = os.urandom(size)
        r = self._client()
        count = 0

        async def lane():
            nonlocal count
            conn = await r.connection_pool.get_connection("XADD")
            packed = conn.pack_commands([("XADD", key, "*", "d", body)] * batch)
            try:
                while gate.claim(batch):
                    await conn.send_packed_command(packed)
                    for _ in range(batch):
                        reply = await conn.read_response()
                        if isinstance(reply, redis.ResponseError):
                            raise reply
                    count += batch
                    gate.add(batch)
            finally:
                await r.connection_pool.release(conn)

        await gate.wait_start()
        await asyncio.gather(*[lane() for _ in range(inflight)])
        t_end = time.monotonic()
        await r.aclose()
        return {"count": count, "t_end": t_end}

    async def _consumer(self, key: str, outstanding: int, on_entry, gate, extra_s: float = 0.0) -> dict:
        r = self._client()
        me = f"c{os.getpid()}"
        count, t_first, t_last, ids = 0, 0.0, 0.0, []
        await gate.wait_start()
        stop_at = None
        while True:
            if gate.finished() and stop_at is None:
                stop_at = time.monotonic() + extra_s
            if stop_at is not None and time.monotonic() >= stop_at:
                break
            p = r.pipeline(transaction=False)
            if ids:
                p.xack(key, GROUP, *ids)
            p.xreadgroup(GROUP, me, {key: ">"}, count=outstanding, block=50)
            got = (await p.execute())[-1]
            ids = []
            for _stream, entries in got or ():
                for entry_id, fields in entries:
                    ids.append(entry_id)
                    on_entry(fields)
            if ids:
                t_last = time.monotonic()
                t_first = t_first or t_last
                count += len(ids)
                gate.add(len(ids))
        if ids:
            await r.xack(key, GROUP, *ids)
        await r.aclose()
        return {"count": count, "t_first": t_first, "t_last": t_last}

    async def consume(self, key: str, outstanding: int, gate) -> dict:
        return await self._consumer(key, min(outstanding, 1000), lambda f: None, gate)

    async def latency_publish(self, key: str, size: int, rate: int, gate) -> dict:
        pad = os.urandom(max(0, size - 8))
        r = self._client()
        warm = [await r.connection_pool.get_connection() for _ in range(64)]  # connect before the clock starts
        for c in warm:
            await c.connect()
            await r.connection_pool.release(c)

        async def send(due: float) -> float:
            await r.xadd(key, {"d": struct.pack(">q", int(due * 1e9)) + pad})
            return time.monotonic() - due

        out = await open_loop(send, rate, gate)
        await r.aclose()
        return out

    async def latency_consume(self, key: str, outstanding: int, gate, grace_s: float) -> dict:
        lat_us: list[float] = []

        def on_entry(fields):
            lat_us.append((time.monotonic_ns() - struct.unpack_from(">q", fields[b"d"])[0]) / 1e3)

        await self._consumer(key, 100, on_entry, gate, grace_s)
        return {"lat_us": lat_us}
