"""Replication, performed: the pure ledger machines of pigeon.cluster.ledger driven over the storage service
(pigeon.v1.Storage) of the ensemble's members. `StorageClient` is one member seen from an owner; `LedgerWriter`
writes one ledger through `Writer` (an append's future is done once Qa members have it durable; a member that
fails or refuses rolls the ledger); `recover_ledger` runs `Recovery` (fence, copy the tail, decide the end).
The metadata steps around them (closing and opening ledgers by CAS) are the caller's (docs/cluster.md)."""

from __future__ import annotations

import asyncio
import struct
from collections import deque

import grpc

from pigeon.core import limits
from pigeon.core.errors import PigeonError
from pigeon.node import append_channel, append_wire
from pigeon.node.proto import pigeon_storage_pb2 as pb
from pigeon.cluster.ledger import (Close, Confirmed, Failed, Fence, Read, Recovery, Roll, Send, Write, Writer)
from pigeon.cluster.quorum import Replication
from pigeon.node.ledger_store import FENCE_EPOCH
from pigeon.ops import tls

_TYPE = struct.Struct("<I")


class LedgerRolled(Exception):
    """The ledger stopped taking appends (a member failed or refused): close it at `roll.close_at` and append the
    unconfirmed entries again to the next ledger."""

    def __init__(self, roll: Roll):
        super().__init__(roll.why)
        self.roll = roll


class RecoveryFailed(Exception):
    pass


class StorageClient:
    def __init__(self, address: str, config=None):
        """`config`: a secured cluster's node calls its peers over mutual TLS with its node certificate."""
        self.address = address
        self.append_at = ""  # its append channel (pigeon.node.append_channel), when it has one and it is known
        self.append_tls = tls.append_client_context(config)  # a secured cluster's channel speaks mutual TLS
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        self.channel = tls.peer_channel(config, address, options)
        self.append_call = self.channel.stream_stream("/pigeon.v1.Storage/Append",  # requests: append_wire's bytes
                                                  request_serializer=None,
                                                  response_deserializer=pb.AppendResponse.FromString)
        self._fence = self.channel.unary_unary("/pigeon.v1.Storage/Fence",
                                               request_serializer=pb.FenceRequest.SerializeToString,
                                               response_deserializer=pb.FenceResponse.FromString)
        self._read = self.channel.unary_unary("/pigeon.v1.Storage/Read",
                                              request_serializer=pb.ReadRequest.SerializeToString,
                                              response_deserializer=pb.ReadResponse.FromString)
        self._delete = self.channel.unary_unary("/pigeon.v1.Storage/Delete",
                                                request_serializer=pb.DeleteLedgersRequest.SerializeToString,
                                                response_deserializer=pb.DeleteLedgersResponse.FromString)
        self._shard_in = self.channel.unary_unary("/pigeon.v1.Storage/ShardIn",
                                                  request_serializer=pb.ShardInRequest.SerializeToString,
                                                  response_deserializer=pb.ShardInResponse.FromString)

    def open_append(self, channel: bool = False) -> "AppendStream":
        """An Append stream to the member; `channel`: over its append channel when it has one (a ledger's
        writer: the bulk of the bytes), else over gRPC (recovery's and repair's copies)."""
        return ChannelAppend(self) if channel and self.append_at else AppendStream(self)

    async def fence(self, ledger: int) -> int:
        return (await self._fence(pb.FenceRequest(ledger=ledger), timeout=limits.storage_call_s)).held

    async def read(self, ledger: int, start: int, end: int) -> list[tuple[int, bytes]]:
        r = await self._read(pb.ReadRequest(ledger=ledger, start=start, end=end), timeout=limits.storage_call_s)
        return list(zip(r.types, r.entries))

    async def shard_in(self, shard_out: bytes) -> None:
        """Ask the member, as the owner of the log a pair is handed to, to take it in (node.handover)."""
        await self._shard_in(pb.ShardInRequest(shard_out=shard_out), timeout=limits.storage_call_s)

    async def answers(self, timeout: float) -> bool:
        """Whether the member answers a call within `timeout` (an empty read: it costs the member nothing)."""
        try:
            await self._read(pb.ReadRequest(ledger=0, start=0, end=0), timeout=timeout)
            return True
        except grpc.aio.AioRpcError:
            return False

    async def delete(self, ledgers: list[int]) -> int:
        request = pb.DeleteLedgersRequest(ledgers=ledgers)
        return (await self._delete(request, timeout=limits.storage_call_s)).segments_removed

    async def close(self) -> None:
        await self.channel.close()


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
        self.why_ended = "the member ended its stream"  # why `answers()` stopped without an error answer
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
        try:
            async for parts in self._requests():
                writer.writelines(parts)  # gathered by the transport: the entries are not joined into a copy
                await writer.drain()
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
                w.writelines(self._take())
        super().flush()

    async def answers(self):
        conn = await self._conn
        if conn is None:
            return
        async for r in append_channel.read_answers(conn[0]):
            yield self._answered(r)

    def close(self) -> None:
        self._stop()
        self._pump.cancel()
        if self._conn.done() and self._conn.result() is not None:
            self._conn.result()[1].transport.abort()
        elif not self._conn.done():
            self._conn.set_result(None)


class LocalMember:
    """This node's own ledger store as a member of an ensemble: the calls of StorageClient, without a network
    hop (and usable before the node's server listens)."""

    def __init__(self, store):
        self.store = store
        self.address = "local"

    def open_append(self, channel: bool = False) -> "LocalAppend":
        return LocalAppend(self.store)

    async def fence(self, ledger: int) -> int:
        return await self.store.fence(ledger)

    async def read(self, ledger: int, start: int, end: int) -> list[tuple[int, bytes]]:
        """The entries, read a few at a time (about limits.loop_slice_bytes) with the loop free for other work
        between: a new owner reads megabytes ahead of its subscribers, and a read in one go held their deliveries
        up meanwhile."""
        out, held = [], 0
        for index in range(start, end):
            got = self.store.read(ledger, index, index + 1)
            if not got:
                break
            out.append((got[0].rtype, bytes(got[0].body)))
            held += len(got[0].body)
            if held >= limits.loop_slice_bytes:
                held = 0
                await asyncio.sleep(0)
        return out

    async def delete(self, ledgers: list[int]) -> int:
        return await self.store.delete(ledgers)

    async def close(self) -> None:
        pass


class LocalAppend:
    """An Append stream to this node's own ledger store: answers in order, once durable. As on a remote member's
    stream, an entry nobody waits for yet waits for the next `flush` (or the store journal's lazy flush): it
    shares that group commit instead of costing a wake-up of the journal's writer and an fdatasync of its own."""

    why_ended = "this node's ledger store closed"

    def __init__(self, store):
        self.store = store
        self._q: asyncio.Queue = asyncio.Queue()

    def send(self, ledger: int, epoch: int, index: int, rtype: int, entry: bytes, where=None) -> None:
        """`where`: (log, offset, position, end) of the entry's record in the node journal, when it is one (the
        store borrows it from there instead of writing it again)."""
        try:
            done, why = self.store.submit(ledger, epoch, index, rtype, entry, now=False, where=where), ""
        except PigeonError as e:
            done, why = None, str(e)
        self._q.put_nowait((index, done, why))

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

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        self._q.put_nowait(None)


class LedgerWriter:
    def __init__(self, ledger: int, epoch: int, members: dict[str, StorageClient], replication: Replication):
        self.ledger, self.epoch = ledger, epoch
        self.machine = Writer(0, list(members), replication)
        self.types: dict[int, int] = {}  # index → record type of the entries not yet confirmed
        self.where: dict[int, tuple] = {}  # index → where the node journal holds it, for those it does
        self.waiters: deque[tuple[int, asyncio.Future]] = deque()  # in index order
        self.rolled: Roll | None = None
        self.failed: set[str] = set()  # members that failed or refused (the next ensemble leaves them out)
        self.on_roll = None  # called once the ledger stops taking appends (also when none were waiting)
        self.on_answer = None  # called with a member's name whenever it answers
        self._quiet: asyncio.Future | None = None  # set while every member has answered everything sent
        self.streams = {m: c.open_append(channel=True) for m, c in members.items()}
        self._readers = [asyncio.create_task(self._follow(m, s)) for m, s in self.streams.items()]
        self._readers.append(asyncio.create_task(self._watch(limits.member_silence_s)))

    def append(self, rtype: int, body: bytes, where: tuple | None = None) -> asyncio.Future:
        """Append one entry; the future is done (with its index) once Qa members have it durable, or fails with
        LedgerRolled. `where`: the node journal's record of it, (log, offset, position, end), when it has one."""
        if self.rolled is not None:
            raise LedgerRolled(self.rolled)
        actions = self.machine.append(body)
        index = self.machine.next - 1
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((index, fut))
        self.types[index] = rtype
        if where is not None:
            self.where[index] = where
        if self._quiet is not None:
            if not self._quiet.done():
                self._quiet.set_result(None)
            self._quiet = None
        self._perform(actions)
        return fut

    def member_gone(self, member: str, why: str) -> None:
        """`member`'s session ended — dead, or paused (it neither answers nor refuses): it fails now rather than
        after limits.member_silence_s without an answer, which held every append waiting for it that long."""
        if self.rolled is None and member in self.streams and member not in self.failed:
            self.failed.add(member)
            self._perform(self.machine.failed(member, why))

    def _perform(self, actions) -> None:
        for act in actions:
            if isinstance(act, Send):
                where = self.where.get(act.offset)
                for m in act.members:
                    self.streams[m].send(self.ledger, self.epoch, act.offset, self.types[act.offset], act.entry,
                                         where)
            elif isinstance(act, Confirmed):
                waiters, types, where = self.waiters, self.types, self.where
                while waiters and waiters[0][0] < act.lac:
                    i, fut = waiters.popleft()
                    types.pop(i, None)
                    where.pop(i, None)
                    if not fut.done():
                        fut.set_result(i)
            elif isinstance(act, Roll):
                self.rolled = act
                if self._quiet is not None and not self._quiet.done():
                    self._quiet.set_result(None)  # (its silence watch ends)
                for _, fut in self.waiters:
                    if not fut.done():
                        fut.set_exception(LedgerRolled(act))
                self.waiters.clear()
                if self.on_roll is not None:
                    self.on_roll()

    async def _follow(self, member: str, stream: AppendStream) -> None:
        try:
            async for index, error in stream.answers():
                if error:
                    self.failed.add(member)
                    self._perform(self.machine.failed(member, error))
                    return
                if self.on_answer is not None:
                    self.on_answer(member)
                self._perform(self.machine.acked_through(member, index + 1))
            self.failed.add(member)  # the member ended the stream (it is stopping): it takes no more entries
            self._perform(self.machine.failed(member, stream.why_ended))
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.failed.add(member)
                self._perform(self.machine.failed(member, f"{e.code().name}: {e.details()}"))
        except asyncio.CancelledError:
            return

    async def _watch(self, silence: float) -> None:
        """Fail a member that has answered nothing of what it was sent `silence` seconds ago. Costs nothing per
        append: a few times per `silence` it notes how far the ledger was sent, and later compares each member's
        answers with the note of `silence` ago."""
        notes: deque[tuple[float, int]] = deque()  # (when, the ledger's next offset then)
        loop = asyncio.get_running_loop()
        step = silence / 4
        while self.rolled is None:
            m = self.machine
            if all(end >= m.next for end in m.answered.values()):  # nothing to wait for: sleep until an append
                notes.clear()
                self._quiet = loop.create_future()
                await self._quiet
                continue
            await asyncio.sleep(step)
            now = loop.time()
            notes.append((now, m.next))
            while len(notes) > 1 and notes[1][0] <= now - silence:
                notes.popleft()
            then, sent = notes[0]
            if then > now - silence:
                continue
            late = [member for member, end in m.answered.items() if end < sent]
            if late:
                self.failed.update(late)
                self._perform(m.failed(late[0], f"no answer in {silence:g} s"))

    def flush(self) -> None:
        """Send every entry appended so far now (somebody waits for it) instead of after the linger."""
        for st in self.streams.values():
            st.flush()

    def stop(self, why: str) -> None:
        """Roll of the writer's own accord: appends fail with LedgerRolled from now on."""
        self._perform(self.machine.stop(why))

    def resend(self) -> list[tuple[int, bytes]]:
        """After a roll: the (type, body) of the entries to append again, in order."""
        r = self.rolled
        return [] if r is None else [(self.types.get(r.close_at + i, 0), b) for i, b in enumerate(r.resend)]

    async def close(self) -> None:
        for s in self.streams.values():
            s.close()
        for t in self._readers:
            t.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


async def recover_ledger(ledger: int, members: dict[str, StorageClient], replication: Replication,
                         ended: frozenset[str] = frozenset()) -> int:
    """Fence `ledger` on its ensemble, copy its tail to the members that lack it, and return where it is to be
    closed; RecoveryFailed when that cannot be decided safely now (retry later). A member of `ended` (its session
    ran out: dead, or paused — one that neither answers nor refuses) that has not answered within
    limits.recovery_ended_s counts as gone rather than holding the recovery for a call's whole deadline: the others
    decide, as they would were it dead (fencing them is what keeps its old writer from an ack quorum)."""
    machine = Recovery(0, list(members), replication)
    events: asyncio.Queue = asyncio.Queue()
    tasks: list[asyncio.Task] = []
    heard: set[str] = set()

    def spawn(coro) -> None:
        tasks.append(asyncio.create_task(coro))

    # Every call to a member ends in exactly one event: a member that fails in a way not foreseen here (or ends
    # its stream without an answer) is gone for this recovery — never silent, which would leave it waiting for
    # ever with the bundle's owner key held (a copy to a member that restarted ends its stream without an answer).
    async def fence(m):
        event = ("gone", m, None)
        try:
            event = ("fenced", m, await members[m].fence(ledger))
        except Exception:  # noqa: BLE001 — gRPC's errors, this node's own store's PigeonError, a broken stream
            pass
        finally:
            events.put_nowait(event)

    async def read(m, offset):
        event = ("gone", m, None)
        try:
            got = await members[m].read(ledger, offset, offset + 1)
            event = ("read", m, (offset, _TYPE.pack(got[0][0]) + got[0][1] if got else None))
        except Exception:  # noqa: BLE001 — as fence's
            pass
        finally:
            events.put_nowait(event)

    async def copy(m, offset, entry):
        event = ("gone", m, None)
        stream = members[m].open_append()
        try:
            (rtype,), body = _TYPE.unpack_from(entry), entry[_TYPE.size:]
            stream.send(ledger, FENCE_EPOCH, offset, rtype, body)
            stream.flush()

            async def first_answer():
                async for index, error in stream.answers():
                    return None if error else index
            # (a member that took the stream and then went silent — cut off without a reset — would hold the
            # recovery, and the takeover, for good: it has a call's deadline, as fence and read have)
            index = await asyncio.wait_for(first_answer(), limits.storage_call_s)
            if index is not None:
                event = ("written", m, index)
        except Exception:  # noqa: BLE001 — as fence's (a deadline passed among them)
            pass
        finally:
            events.put_nowait(event)
            stream.close()

    def perform(actions) -> int | None:
        for act in actions:
            if isinstance(act, Fence):
                for m in act.members:
                    spawn(fence(m))
            elif isinstance(act, Read):
                spawn(read(act.member, act.offset))
            elif isinstance(act, Write):
                for m in act.members:
                    spawn(copy(m, act.offset, act.entry))
            elif isinstance(act, Close):
                return act.end
            elif isinstance(act, Failed):
                raise RecoveryFailed(f"ledger {ledger}: {act.reason}")
        return None

    async def give_up_on(m):
        await asyncio.sleep(limits.recovery_ended_s)
        if m not in heard:
            events.put_nowait(("gone", m, None))

    try:
        end = perform(machine.start())
        for m in ended & members.keys():
            spawn(give_up_on(m))
        while end is None:
            kind, m, value = await events.get()
            heard.add(m)
            if kind == "fenced":
                end = perform(machine.fenced(m, value))
            elif kind == "read":
                end = perform(machine.read(m, *value))
            elif kind == "written":
                end = perform(machine.written(m, value))
            else:
                end = perform(machine.unreachable(m))
        return end
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
