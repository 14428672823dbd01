"""The append channel: pigeon.v1.Storage's Append stream on a TCP connection of its own, without gRPC — the
replication path's bytes are most of a cluster's work, and a member spends several times the CPU taking a
megabyte from a gRPC stream as from a socket read straight into the buffer that is then written (docs/cluster.md
has the measurement). Owns the rules:

  * one connection is one Append stream: the owner sends frames `length:u32 · AppendRequest`
    (pigeon.node.append_wire, little endian length), the member answers `length:u32 · AppendResponse`, in order,
    an answer covering every entry before its index — the same requests and answers as the gRPC method, taken
    by the same pipeline (`serve_appends`), so the two paths cannot differ in what they store or answer;
  * a frame is read into a buffer of its own that nothing writes again, and the entries handed to the store are
    read-only views into it: the store's journal writes them from there (one copy, the kernel's, on the way in);
  * a frame longer than limits.grpc_receive_bytes_max or one that does not parse ends the connection (the owner
    sees its member gone and rolls the ledger, as after any member failure); nothing of it is stored;
  * an owner reaches a member through the proxy gRPC would use (`grpc_proxy`, `https_proxy`, `http_proxy`, with
    `no_grpc_proxy` / `no_proxy`), by HTTP CONNECT, so a network that routes node-to-node gRPC through a proxy
    routes this too;
  * on a secured node the channel speaks mutual TLS (pigeon.ops.tls): the member serves only a caller whose
    certificate the cluster's CA signed and names a node (pigeon.ops.certs.identity_of), as its storage service
    does; any other connection is closed before a byte of it is read as a frame.

A node opens it on `--append-port` (default: a free port) and announces it in its membership record."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
from collections import deque
from urllib.parse import urlsplit

from google.protobuf.message import DecodeError

from pigeon.core import limits
from pigeon.core.errors import InvalidArgument, PigeonError
from pigeon.node import append_wire, hops
from pigeon.node.proto import pigeon_storage_pb2 as pb

log = logging.getLogger("pigeon.replication")

LENGTH = struct.Struct("<I")

class Pipeline:
    """The member's side of an Append stream, driven by callbacks: `take(raw)` hands a request (AppendRequest
    bytes) to `store` as it arrives, and `answer([(ledger, index, refusal), …])` is called, in order, with the
    answers its group commits made durable — those of one ledger, one after the other, merged into one (an answer
    covers what is before it) — in the journal's callback that made them durable: no task, no queue between the
    socket and the store or between the store and the socket. `end(exc)` once: None after the last answer when
    `finish` was called; the error — after the answers of what came before — when a request does not parse
    (InvalidArgument) or the store's writer failed. `transport` ("channel" or "grpc") is counted in the store's
    statistics."""

    def __init__(self, store, transport: str, answer, end):
        self.store, self._transport = store, transport
        self._answer, self._end = answer, end
        self._q: deque = deque()  # [ledger, last index, journal position (None: refused), refusal or error]
        self._finishing = False
        self._over = False

    def take(self, raw) -> None:
        """One request; its entries are in the store's journal when this returns (durable once answered). `ask`
        once a read's requests are taken."""
        if self._over or self._finishing:
            return
        store = self.store
        store.append_requests[self._transport] += 1
        try:
            ledger, epoch, index, types, entries = append_wire.decode(raw)
        except append_wire.Malformed as e:
            self._finishing = True
            self._q.append((None, 0, None, InvalidArgument(f"The request is not a valid pigeon.v1.AppendRequest: "
                                                           f"{e}.")))
            self._pump()
            return
        try:
            last, at = store.take_many(ledger, epoch, index, types, entries)
        except PigeonError as e:  # entries before the refused one were taken; the writer rolls
            self._q.append((ledger, index + len(entries) - 1, None, str(e)))
            self._pump()
            return
        self._q.append((ledger, last, at, ""))
        store.on_durable(at, self._heard)

    def ask(self) -> None:
        """Make what was taken durable now: its writer waits for the answers."""
        if self._q and not self._over:
            self.store.flush()

    def finish(self) -> None:
        """No more requests: `end(None)` once what was taken is answered."""
        self._finishing = True
        self._pump()

    def stop(self) -> None:
        """The stream is gone: nothing more is answered or ended."""
        self._over = True
        self._q.clear()

    def _heard(self, exc) -> None:
        if exc is not None:
            self._stop_with(exc)
        else:
            self._pump()

    def _stop_with(self, exc) -> None:
        if not self._over:
            self._over = True
            self._q.clear()
            self._end(exc)

    def _pump(self) -> None:
        if self._over:
            return
        q, durable, out = self._q, self.store.writer.durable, []
        while q:
            ledger, last, at, why = q[0]
            if at is not None and at > durable:
                break
            q.popleft()
            if isinstance(why, BaseException):  # a request that did not parse: the stream ends here
                if out:
                    self._answer(out)
                self._stop_with(why)
                return
            if out and not why and not out[-1][2] and out[-1][0] == ledger:
                out[-1] = (ledger, last, "")
            else:
                out.append((ledger, last, why))
        if out:
            self._answer(out)
        if not q and self._finishing and not self._over:
            self._over = True
            self._end(None)


async def serve_appends(store, requests, transport: str):
    """`Pipeline` as an async generator over an async iterator of requests (the gRPC method's, the simulator's):
    (ledger, index, refusal) yielded in order once durable; InvalidArgument, after the answers of what came before,
    when a request does not parse."""
    out: asyncio.Queue = asyncio.Queue()
    done = object()
    pipe = Pipeline(store, transport, out.put_nowait, lambda exc: out.put_nowait(done if exc is None else exc))

    async def take():
        try:
            async for raw in requests:
                pipe.take(raw)
                pipe.ask()
        finally:
            pipe.finish()

    reader = asyncio.create_task(take())
    try:
        while (got := await out.get()) is not done:
            if isinstance(got, BaseException):
                raise got
            for answer in got:
                yield answer
        await reader  # (the requests' own end: an error of theirs is this stream's)
    finally:
        pipe.stop()
        reader.cancel()


# --- the member's side ---------------------------------------------------------------------------------------

def listen(host: str, port: int) -> socket.socket:
    """The channel's listening socket (bound now, so the node can announce its port before it serves)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class ChannelServer:
    """The member's channel: serves Append streams for its ledger store until `close`, which also ends the
    connections open then (their owners roll their ledgers)."""

    def __init__(self, store, tls: ssl.SSLContext | None = None):
        self.store = store
        self.tls = tls  # mutual TLS (a secured node): callers must be nodes
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, sock: socket.socket) -> "ChannelServer":
        self._server = await asyncio.get_running_loop().create_server(lambda: _Connection(self), sock=sock,
                                                                      ssl=self.tls)
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self.connections):
            c.transport.abort()


async def serve(sock: socket.socket, store, tls: ssl.SSLContext | None = None) -> ChannelServer:
    """Serve Append streams for `store` on `sock` (`close()` the server returned to stop); with `tls`
    (pigeon.ops.tls.append_server_context) only to nodes of the cluster."""
    return await ChannelServer(store, tls).start(sock)


def _caller(transport) -> str:
    """The principal the caller's verified certificate names ("" for none)."""
    from pigeon.ops import certs  # (a secured node's only: the cryptography package costs every start ~25 ms)

    ssl_object = transport.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return certs.identity_of(ssl.DER_cert_to_PEM_cert(der).encode()) if der else ""


class _Connection(asyncio.BufferedProtocol):
    """A member's Append stream: each frame is taken by the pipeline in the read that completes it, and the
    answers of one group commit are written with one write."""

    def __init__(self, server: ChannelServer):
        self.server = server
        self._scratch = bytearray(limits.append_scratch_bytes)
        self._have = 0  # bytes of _scratch read and not yet taken
        self._frame: bytearray | None = None  # a frame too long for _scratch, being read into a buffer of its own
        self._got = 0  # … how much of it has come
        self._pipe = Pipeline(server.store, "channel", self._answered, self._ended)
        self.transport: asyncio.Transport | None = None
        self._refused = False  # not a node: nothing it sends is read

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.server.tls is not None and not _caller(transport).startswith("node:"):
            log.warning("append channel: %s is not a node of the cluster (its certificate names %r): closed",
                        transport.get_extra_info("peername"), _caller(transport))
            self._refused = True
            self._pipe.stop()
            transport.abort()
            return
        self.server.connections.add(self)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _answered(self, answers: list) -> None:
        if hops.ON:
            hops.mark("answering")
        out = []
        for ledger, index, why in answers:
            raw = pb.AppendResponse(ledger=ledger, index=index, error=why).SerializeToString()
            out += (LENGTH.pack(len(raw)), raw)
        self.transport.write(b"".join(out))

    def _ended(self, exc) -> None:
        if exc is not None:  # a connection's end: the owner sees its member gone
            log.warning("append channel from %s closed: %s", self.transport.get_extra_info("peername"), exc)
        self.transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._got:]
        return memoryview(self._scratch)[self._have:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._refused:
            return
        pipe = self._pipe
        if self._frame is not None:
            self._got += nbytes
            if self._got == len(self._frame):
                pipe.take(memoryview(self._frame).toreadonly())  # never written again
                self._frame = None
                pipe.ask()
            return
        self._have += nbytes
        buf, pos, have = self._scratch, 0, self._have
        while have - pos >= LENGTH.size:
            (n,) = LENGTH.unpack_from(buf, pos)
            if n > limits.grpc_receive_bytes_max:
                log.warning("append channel from %s: a frame of %d bytes, above the largest (%d): closed",
                            self.transport.get_extra_info("peername"), n, limits.grpc_receive_bytes_max)
                self._have = 0
                pipe.stop()
                self.transport.abort()
                return
            start = pos + LENGTH.size
            if have - start >= n:
                if hops.ON:
                    hops.mark("frame")
                pipe.take(bytes(buf[start:start + n]))
                pos = start + n
            elif LENGTH.size + n > len(buf):  # too long for the scratch buffer: the rest goes into its own
                self._frame = bytearray(n)
                self._got = have - start
                self._frame[:self._got] = buf[start:have]
                pos = have
                break
            else:
                break
        if pos:
            rest = have - pos
            buf[:rest] = buf[pos:have]
            self._have = rest
            pipe.ask()  # (once for every request this read completed: one wake-up of the journal's writer)

    def eof_received(self) -> bool:
        self._pipe.finish()  # the owner closed its side: answer what it sent, then close ours
        return self.server.tls is None  # (TLS has no half-closed connection: there the answers are lost)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        self._pipe.stop()


# --- the owner's side ----------------------------------------------------------------------------------------

def _proxy_for(host: str) -> str:
    """The proxy gRPC would take to `host` ("" for none), from the same environment variables."""
    proxy = os.environ.get("grpc_proxy") or os.environ.get("https_proxy") or os.environ.get("http_proxy") or ""
    if not proxy:
        return ""
    skip = os.environ.get("no_grpc_proxy") or os.environ.get("no_proxy") or ""
    for name in (s.strip() for s in skip.split(",") if s.strip()):
        if name == "*" or host == name or host.endswith("." + name.lstrip(".")):
            return ""
    return proxy


async def connect(address: str, tls: ssl.SSLContext | None = None) -> tuple[asyncio.StreamReader,
                                                                            asyncio.StreamWriter]:
    """A connection to a member's channel at `address` (host:port), through the proxy when there is one; with
    `tls` (pigeon.ops.tls.append_client_context) over mutual TLS, the member's certificate checked for its host."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    proxy = _proxy_for(host)
    if not proxy:
        reader, writer = await asyncio.open_connection(host, int(port), ssl=tls,
                                                       server_hostname=host if tls is not None else None)
    else:
        p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
        reader, writer = await asyncio.open_connection(p.hostname, p.port or 80)
        writer.write(f"CONNECT {address} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        status = await reader.readline()
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        if status.split()[1:2] != [b"200"]:
            writer.close()
            raise ConnectionError(f"the proxy {p.hostname}:{p.port} answered {status.decode(errors='replace').strip()!r}")
        if tls is not None:  # the tunnel is the member's: TLS runs end to end through it
            await writer.start_tls(tls, server_hostname=host)
    writer.transport.set_write_buffer_limits(high=2 * limits.storage_message_bytes_max)
    return reader, writer


class Answers(asyncio.Protocol):
    """The owner's side of a connection once it is open (it replaces the StreamReader's protocol): each
    AppendResponse is handed to `on_answer` in the callback that read it, the connection's end to `on_end(why)`
    once; and the flow control of what the owner writes (`drain`)."""

    def __init__(self, on_answer, on_end):
        self._on_answer, self._on_end = on_answer, on_end
        self._buf = bytearray()
        self._paused = False
        self._drained: asyncio.Future | None = None
        self._lost = False

    def detach(self) -> None:
        """Hand nothing on from now on (the stream was closed)."""
        self._on_answer = self._on_end = _nothing

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, have = 0, len(buf)
        while have - pos >= LENGTH.size:
            (n,) = LENGTH.unpack_from(buf, pos)
            start = pos + LENGTH.size
            if have - start < n:
                break
            try:
                r = pb.AppendResponse.FromString(bytes(buf[start:start + n]))
            except DecodeError:
                self._end("sent an answer that does not parse")
                return
            pos = start + n
            if hops.ON:
                hops.mark("acked")
            self._on_answer(r)
        if pos:
            del buf[:pos]

    def _end(self, why: str) -> None:
        on_end, self._on_answer, self._on_end = self._on_end, _nothing, _nothing
        on_end(why)

    def eof_received(self) -> bool:
        return False  # (the member closed its side: the connection closes, connection_lost says so)

    def connection_lost(self, exc) -> None:
        self._lost = True
        self.resume_writing()
        self._end(f"broke ({exc})" if exc is not None else "was closed")

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("the append channel's connection was lost")
        if self._paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained


def _nothing(*args) -> None:
    pass


async def read_answers(reader: asyncio.StreamReader):
    """The AppendResponses a member sends, in order, until the connection ends (closed or broken)."""
    while True:
        try:
            (n,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
            raw = await reader.readexactly(n)
        except (asyncio.IncompleteReadError, OSError):
            return
        if hops.ON:
            hops.mark("acked")
        yield pb.AppendResponse.FromString(raw)

