"""The Append streams an owner writes a ledger through (pigeon.node.replication's `LedgerWriter`): one to each
member of the ledger's ensemble, in order — over gRPC (`AppendStream`), over the member's append channel
(`ChannelAppend`, pigeon.node.append_channel) or to this node's own ledger store (`LocalAppend`). Each sends
entries in requests that gather what queues while the stream is busy, and hands back answers in order, an answer
covering every entry before its index: through `answers()`, or — the writer's way — `follow(on_answer, on_end)`,
which the channel and the own store serve from the callback that has the answer, with no task between."""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from pigeon.core import limits
from pigeon.core.errors import PigeonError
from pigeon.node import append_channel, append_wire, hops
from pigeon.node.proto import pigeon_storage_pb2 as pb

_MEMBER_ENDED = "the member ended its stream"


class AppendStream:
    """One Append stream to a member: `send` entries in order; `answers()` yields (index, error) in order, an
    answer covering every entry up to its index. Entries sent while the stream is busy go out together, in one
    request (a batch of consecutive entries of one ledger) of at most limits.storage_message_bytes_max — more
    would pass the member's largest message, which it refuses: the ledger rolled, the next one was sent the same
    batch, and so on without end (1 MB records do it). At most
    limits.append_requests_in_flight_max requests wait for their answer: while the window is full, entries
    gather into the next request (as Nagle's algorithm does) — records coming faster than a member answers
    share requests instead of costing a message each. An entry nobody waits for yet (a delivery, an ack on a
    stream) lingers up to limits.replication_linger_s, so it rides with the next one somebody waits for (a
    publish): `flush` sends what is queued at once."""

    def __init__(self, client: StorageClient):
        self._q: list = []  # (ledger, epoch, index, type, entry) not yet sent
        self._ready = asyncio.Event()  # send what is queued now (flush, the linger's end, close)
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._idle = False  # the sending task waits for `_ready` with nothing of its own in hand
        self._sent: deque[int] = deque()  # the last index of each request not yet answered, in order
        self._room = asyncio.Event()  # set when an answer frees a place in the window
        self.why_ended = _MEMBER_ENDED  # why `answers()` stopped without an error answer
        self._open(client)

    def _open(self, client: StorageClient) -> None:
        self.call = client.append_call(self._requests())

    def _encode(self, ledger: int, epoch: int, index: int, types: list[int], entries: list) -> bytes:
        return append_wire.encode(ledger, epoch, index, types, entries)

    async def _requests(self):
        while True:
            if not self._ready.is_set():  # (set while what is queued is to go: a request may take part of it)
                self._idle = True
                await self._ready.wait()
                self._idle = False
                await asyncio.sleep(0)  # what the callbacks ready now append goes along in the same request
            if self._closed:
                return
            if not self._q:
                self._ready.clear()
                continue
            while len(self._sent) >= limits.append_requests_in_flight_max and not self._closed:
                self._room.clear()  # the window is full: what comes meanwhile joins the next request
                await self._room.wait()
            if self._closed:
                return
            yield self._take()

    def _take(self):
        """The next request: the queue's first entries that are consecutive entries of one ledger and epoch, up to
        a size; noted in the window."""
        q = self._q
        ledger, epoch, index, rtype, entry = q[0]
        j, size = 1, len(entry)
        while j < len(q) and q[j][0] == ledger and q[j][1] == epoch and q[j][2] == index + j and \
                size + len(q[j][4]) <= limits.storage_message_bytes_max:
            size += len(q[j][4])
            j += 1
        run, self._q = q[:j], q[j:]
        if not self._q:  # all taken: what is queued from now on lingers again
            self._ready.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self._sent.append(index + j - 1)
        return self._encode(ledger, epoch, index, [e[3] for e in run], [e[4] for e in run])

    def send(self, ledger: int, epoch: int, index: int, rtype: int, entry: bytes, where=None) -> None:
        """Queue an entry: it goes out with the next flush, or at most limits.replication_linger_s from now.
        (`where` is for the owner's own store: LocalAppend.)"""
        self._q.append((ledger, epoch, index, rtype, entry))
        if self._timer is None and not self._ready.is_set():
            self._timer = asyncio.get_running_loop().call_later(limits.replication_linger_s, self._linger_over)

    def _linger_over(self) -> None:
        self._timer = None
        self._ready.set()

    def flush(self) -> None:
        """Send what is queued now: somebody waits for it."""
        if self._q:
            self._ready.set()

    async def answers(self):
        async for r in self.call:
            yield self._answered(r)

    def follow(self, on_answer, on_end) -> asyncio.Task | None:
        """Hand every answer to `on_answer(index, error)` as it comes and the stream's end to `on_end(why)`, instead
        of `answers()`: here from a task reading them (the task returned; cancel it to stop)."""
        return asyncio.get_running_loop().create_task(self._follow(on_answer, on_end))

    async def _follow(self, on_answer, on_end) -> None:
        try:
            async for index, error in self.answers():
                on_answer(index, error)
            on_end(self.why_ended)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                on_end(f"{e.code().name}: {e.details()}")
        except asyncio.CancelledError:
            return

    def _answered(self, r: pb.AppendResponse) -> tuple[int, str]:
        sent = self._sent
        while sent and sent[0] <= r.index:
            sent.popleft()
        self._room.set()
        return r.index, r.error

    def close(self) -> None:
        self._stop()
        self.call.cancel()

    def _stop(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._ready.set()
        self._room.set()


class ChannelAppend(AppendStream):
    """An Append stream over the member's append channel (pigeon.node.append_channel): the same requests, batching
    and window as over gRPC, each request one frame on a connection of the stream's own. A connection that cannot
    be made, or breaks, ends `answers()` (`why_ended` says why): the writer counts the member failed."""

    def _open(self, client: StorageClient) -> None:
        self.address = client.append_at
        self._tls = client.append_tls
        self._conn: asyncio.Future = asyncio.get_running_loop().create_future()  # (reader, writer) | None
        self._writer: asyncio.StreamWriter | None = None  # once connected
        self._answers: append_channel.Answers | None = None  # `follow`'s: the connection's protocol once open
        self._pump = asyncio.create_task(self._send_all())

    def _encode(self, ledger: int, epoch: int, index: int, types: list[int], entries: list) -> list[bytes]:
        return append_wire.encode_parts(ledger, epoch, index, types, entries, framed=True)

    async def _send_all(self) -> None:
        try:
            conn = await asyncio.wait_for(append_channel.connect(self.address, self._tls), limits.append_connect_s)
        except (OSError, asyncio.TimeoutError) as e:  # (ssl.SSLError is an OSError)
            self.why_ended = f"its append channel at {self.address} cannot be reached ({e or type(e).__name__})"
            if not self._conn.done():
                self._conn.set_result(None)
            return
        if self._conn.done():  # closed while connecting (the connect won the race with the cancel)
            conn[1].transport.abort()
            return
        self._conn.set_result(conn)
        writer = self._writer = conn[1]
        drain = writer.drain
        if self._answers is not None:  # answers go to `follow`'s callbacks straight from the socket's reads
            writer.transport.set_protocol(self._answers)
            drain = self._answers.drain
        try:
            async for parts in self._requests():
                if hops.ON:
                    hops.mark("replicating")
                writer.writelines(parts)  # gathered by the transport: the entries are not joined into a copy
                await drain()
        except OSError as e:
            self.why_ended = f"its append channel at {self.address} broke ({e})"
            writer.transport.abort()  # the answers end with it
        finally:
            self._writer = None

    def flush(self) -> None:
        """Send what is queued now — here, when the sending task is idle, the window has room and the connection
        has nothing left to write: the task would take two turns of the loop to get to it, each as long as the
        loop's busiest callback (at 1,000 publishes a second on a cluster owner, 0.2–0.3 ms before the request
        left, on the way to every answer). What does not fit goes with the task, as before."""
        w = self._writer
        if self._q and self._idle and w is not None and not w.transport.is_closing() and \
                w.transport.get_write_buffer_size() == 0:
            while self._q and len(self._sent) < limits.append_requests_in_flight_max:
                if hops.ON:
                    hops.mark("replicating")
                w.writelines(self._take())
        super().flush()

    async def answers(self):
        conn = await self._conn
        if conn is None:
            return
        async for r in append_channel.read_answers(conn[0]):
            yield self._answered(r)

    def follow(self, on_answer, on_end) -> None:
        """`AppendStream.follow`, without a task: each answer is handed on in the callback that reads it from the
        socket: the answer confirms its entries there (read through a StreamReader by a task, it took two turns of
        the event loop more, each as long as the loop's busiest callback on a loaded owner)."""
        def answered(r: pb.AppendResponse) -> None:
            on_answer(*self._answered(r))

        def ended(why: str) -> None:
            if self.why_ended == _MEMBER_ENDED:
                self.why_ended = f"its append channel at {self.address} {why}"
            on_end(self.why_ended)

        self._answers = append_channel.Answers(answered, ended)
        if self._conn.done() and self._conn.result() is not None:  # (connected already: from now on)
            self._conn.result()[1].transport.set_protocol(self._answers)

        def unreachable(conn: asyncio.Future) -> None:
            if conn.result() is None and not self._closed:
                on_end(self.why_ended)
        self._conn.add_done_callback(unreachable)

    def close(self) -> None:
        self._stop()
        if self._answers is not None:
            self._answers.detach()  # (the abort below ends the connection: that is not the member's doing)
        self._pump.cancel()
        if self._conn.done() and self._conn.result() is not None:
            self._conn.result()[1].transport.abort()
        elif not self._conn.done():
            self._conn.set_result(None)


class LocalAppend:
    """An Append stream to this node's own ledger store: answers in order, once durable. As on a remote member's
    stream, an entry nobody waits for yet waits for the next `flush` (or the store journal's lazy flush): it
    shares that group commit instead of costing a wake-up of the journal's writer and an fdatasync of its own."""

    why_ended = "this node's ledger store closed"

    def __init__(self, store):
        self.store = store
        self._q: asyncio.Queue = asyncio.Queue()  # for `answers()`
        self._sent: deque = deque()  # for `follow`: (index, done, why) not yet answered, in order
        self._on = None  # `follow`'s (on_answer, on_end)

    def send(self, ledger: int, epoch: int, index: int, rtype: int, entry: bytes, where=None) -> None:
        """`where`: (log, offset, position, end) of the entry's record in the node journal, when it is one (the
        store borrows it from there instead of writing it again)."""
        try:
            done, why = self.store.submit(ledger, epoch, index, rtype, entry, now=False, where=where), ""
        except PigeonError as e:
            done, why = None, str(e)
        if self._on is None:
            self._q.put_nowait((index, done, why))
            return
        self._sent.append((index, done, why))
        if done is None:  # (answered after the answers before it, never from inside the writer's own call)
            asyncio.get_running_loop().call_soon(self._settle)
        elif len(self._sent) == 1 or done is not self._sent[-2][1]:  # (entries of one group commit share it)
            done.add_done_callback(self._settle)

    async def answers(self):
        while (item := await self._q.get()) is not None:
            index, done, why = item
            if done is not None:
                try:
                    await done
                except PigeonError as e:  # a journal that failed (a disk error): this member takes no more
                    yield index, str(e)
                    return
            yield index, why

    def follow(self, on_answer, on_end) -> None:
        """`AppendStream.follow` without a task: an entry is answered in the callback of its group commit."""
        self._on = (on_answer, on_end)

    def _settle(self, _=None) -> None:
        """Answer the entries durable by now, in order: the last of them covers the rest."""
        sent, last = self._sent, None
        while sent and (sent[0][1] is None or sent[0][1].done()):
            index, done, why = sent.popleft()
            if done is not None and done.cancelled():  # (the store closing): no answer — the stream ends
                if last is not None:
                    self._on[0](last, "")
                sent.clear()
                on_end, self._on = self._on[1], (_nothing, _nothing)
                on_end(self.why_ended)
                return
            if done is not None and done.exception() is not None:
                why = str(done.exception())  # a journal that failed (a disk error): this member takes no more
            if why:
                if last is not None:
                    self._on[0](last, "")
                sent.clear()
                self._on[0](index, why)
                self._on = (_nothing, _nothing)
                return
            last = index
        if last is not None:
            self._on[0](last, "")

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        self._q.put_nowait(None)
        if self._on is not None:
            self._on = (_nothing, _nothing)


def _nothing(*args) -> None:
    pass
