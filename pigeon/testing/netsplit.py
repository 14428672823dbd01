"""Network partitions between real processes on loopback, without privileges: every node is started with
`grpc_proxy` pointing at a CONNECT proxy of its own, so each gRPC connection it opens (to its peers and to etcd)
— and each append channel to a peer, which takes the same proxy — is a tunnel through that proxy, and the proxy
knows which node opened it and where it goes.

`cut(node)` isolates a node as a pulled cable would: tunnels from it and to it stop carrying bytes (they are read
and dropped; no reset, so calls on them wait for their own deadlines) and new ones are never answered. With
`etcd=False` only the node-to-node tunnels are cut and the node keeps its etcd session. `heal()` ends every cut;
the tunnels that crossed one are closed (their bytes in between are gone: a connection does not survive that)
and the connections left waiting are answered. Clients outside the cluster (the test's publishers) connect to
the nodes directly and are never cut.

Between groups of places (node ids, or the "host:port" of something that is not a node: an etcd), `delay(a, b,
s)` makes every byte of a tunnel between the two groups arrive `s` seconds late, each way — a link between
regions (tunnels opened from then on) — and `partition(a, b)` cuts the two groups apart as `cut` cuts a node off,
until `heal()`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

_CHUNK = 1 << 16


@dataclass(eq=False)
class _Tunnel:
    source: str  # node id
    target: str  # "host:port"
    writers: list = field(default_factory=list)
    crossed_cut: bool = False


class Network:
    """CONNECT proxies for a set of nodes; runs its own event loop on a daemon thread."""

    def __init__(self, etcd: str):
        self.etcd = etcd.split("://")[-1]  # the etcd endpoint's host:port
        self._address: dict[str, set[str]] = {}  # node id → the addresses it listens on
        self._cut: dict[str, bool] = {}  # node id → whether its etcd tunnels are cut too
        self._delays: dict[frozenset, float] = {}  # {place, place} → seconds each way
        self._partitions: list[tuple[frozenset, frozenset]] = []  # groups of places cut apart
        self._tunnels: set[_Tunnel] = set()
        self._healed: asyncio.Event | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="netsplit", daemon=True).start()
        self._call(self._init())

    async def _init(self) -> None:
        self._healed = asyncio.Event()
        self._healed.set()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    # --- the test's side ----------------------------------------------------------------------------------
    def add(self, node_id: str, *addresses: str | None) -> dict[str, str]:
        """Register a node listening on `addresses` (its gRPC port, its append channel); returns the environment
        to start it with."""
        self._address[node_id] = {a for a in addresses if a}
        port = self._call(self._listen(node_id))
        return {"grpc_proxy": f"http://127.0.0.1:{port}", "no_grpc_proxy": "", "no_proxy": ""}

    def cut(self, node_id: str, etcd: bool = True) -> None:
        self._call(self._set_cut(node_id, etcd))

    def heal(self) -> None:
        self._call(self._heal())

    def delay(self, a: Iterable[str], b: Iterable[str], seconds: float) -> None:
        async def go():
            for x in a:
                for y in b:
                    self._delays[frozenset((x, y))] = seconds
        self._call(go())

    def partition(self, a: Iterable[str], b: Iterable[str]) -> None:
        async def go():
            self._partitions.append((frozenset(a), frozenset(b)))
            self._healed.clear()
            for t in self._tunnels:
                if self._blocked(t.source, t.target):
                    t.crossed_cut = True
        self._call(go())

    def close(self) -> None:
        async def stop():
            for s in self._servers:
                s.close()
            for t in list(self._tunnels):
                for w in t.writers:
                    w.close()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)  # (none left pending when the loop stops)
        self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)

    # --- the proxies ----------------------------------------------------------------------------------------
    def _node_at(self, target: str) -> str | None:
        return next((n for n, a in self._address.items() if target in a), None)

    def _place(self, target: str) -> str:
        return self._node_at(target) or target

    def _blocked(self, source: str, target: str) -> bool:
        if source in self._cut and (target != self.etcd or self._cut[source]):
            return True
        there = self._place(target)
        if any((source in a and there in b) or (source in b and there in a) for a, b in self._partitions):
            return True
        return there in self._cut

    async def _listen(self, node_id: str) -> int:
        server = await asyncio.start_server(lambda r, w: self._serve(node_id, r, w), "127.0.0.1", 0)
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def _serve(self, source: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            method, target, *_ = request.decode("latin-1").split()
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                writer.close()
                return
            while self._blocked(source, target):  # a connection across a cut is not answered while it lasts
                await self._healed.wait()
            host, port = target.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except (OSError, ValueError, asyncio.IncompleteReadError):
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        tunnel = _Tunnel(source, target, [writer, up_writer])
        self._tunnels.add(tunnel)
        late = self._delays.get(frozenset((source, self._place(target))), 0.0)
        try:
            await asyncio.gather(self._pipe(tunnel, reader, up_writer, late), self._pipe(tunnel, up_reader, writer, late))
        except asyncio.CancelledError:  # (closing: the server's callback would choke on a cancelled handler)
            pass
        finally:
            self._tunnels.discard(tunnel)

    async def _pipe(self, tunnel: _Tunnel, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    late: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue | None = asyncio.Queue() if late else None
        sender = loop.create_task(self._send_late(queue, writer)) if queue is not None else None
        try:
            while data := await reader.read(_CHUNK):
                if self._blocked(tunnel.source, tunnel.target):
                    tunnel.crossed_cut = True
                    continue  # dropped on the floor
                if queue is not None:
                    queue.put_nowait((loop.time() + late, data))
                    continue
                writer.write(data)
                await writer.drain()
            if sender is not None:
                queue.put_nowait(None)
                await sender  # (what is on its way arrives before the end)
        except (OSError, ConnectionError):
            pass
        finally:
            if sender is not None:
                sender.cancel()
            for w in tunnel.writers:
                w.close()

    @staticmethod
    async def _send_late(queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        """Write each chunk at its time, in order (a link's delay)."""
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            due, data = item
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    async def _set_cut(self, node_id: str, etcd: bool) -> None:
        self._cut[node_id] = etcd
        self._healed.clear()
        for t in self._tunnels:
            if self._blocked(t.source, t.target):
                t.crossed_cut = True

    async def _heal(self) -> None:
        self._cut.clear()
        self._partitions.clear()
        for t in list(self._tunnels):
            if t.crossed_cut:
                for w in t.writers:
                    w.close()
        self._healed.set()
