"""Replication, performed: the pure ledger machines of pigeon.cluster.ledger driven over the storage service
(pigeon.v1.Storage) of the ensemble's members. `StorageClient` is one member seen from an owner (its Append
streams: pigeon.node.append_streams); `LedgerWriter` writes one ledger through `Writer` (an append is confirmed
once Qa members have it durable; a member that fails or refuses rolls the ledger); `recover_ledger` runs
`Recovery` (fence, copy the tail, decide the end).
The metadata steps around them (closing and opening ledgers by CAS) are the caller's (docs/cluster.md)."""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from functools import partial

import grpc

from pigeon.core import limits
from pigeon.node.append_streams import AppendStream, ChannelAppend, LocalAppend
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
        """The entries, read about limits.loop_slice_bytes at a time with the loop free for other work between (a
        new owner reads megabytes ahead of its subscribers, and a read in one go held their deliveries up
        meanwhile), none of them from the disk on the loop (LedgerStore.read_warm)."""
        out = []
        while start < end:
            got = await self.store.read_warm(ledger, start, end, limits.loop_slice_bytes)
            if not got:
                break
            out += [(e.rtype, e.body) for e in got]
            start += len(got)
            if start < end:
                await asyncio.sleep(0)
        return out

    async def delete(self, ledgers: list[int]) -> int:
        return await self.store.delete(ledgers)

    async def close(self) -> None:
        pass


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
        self.through: dict[str, int] = {}  # member → the end of what it answered (also after the writer stopped)
        self._flushed: dict[str, int] = {}  # member → the ledger's next index when a round was last sent to it
        self._turn = 0  # (whose turn a round is, of the members besides this node)
        self._quiet: asyncio.Future | None = None  # set while every member has answered everything sent
        self._closed = False
        self.streams = {m: c.open_append(channel=True) for m, c in members.items()}
        self._readers = [t for m, st in self.streams.items()
                         if (t := st.follow(partial(self._heard, m), partial(self._ended, m))) is not None]
        self._readers.append(asyncio.create_task(self._watch(limits.member_silence_s)))

    def append(self, rtype: int, body: bytes, where: tuple | None = None,
               confirmed: Callable[[], None] | None = None) -> asyncio.Future | None:
        """Append one entry; the future is done (with its index) once Qa members have it durable, or fails with
        LedgerRolled. `where`: the node journal's record of it, (log, offset, position, end), when it has one.
        With `confirmed`, no future: `confirmed()` is called then instead (and nothing when the ledger rolls — the
        caller hears of that from `on_roll`), in the callback that has the member's answer."""
        if self.rolled is not None:
            raise LedgerRolled(self.rolled)
        actions = self.machine.append(body)
        index = self.machine.next - 1
        fut = asyncio.get_running_loop().create_future() if confirmed is None else None
        self.waiters.append((index, fut if confirmed is None else confirmed))
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
                    if not isinstance(fut, asyncio.Future):
                        fut()
                    elif not fut.done():
                        fut.set_result(i)
            elif isinstance(act, Roll):
                self.rolled = act
                if self._quiet is not None and not self._quiet.done():
                    self._quiet.set_result(None)  # (its silence watch ends)
                for _, fut in self.waiters:
                    if isinstance(fut, asyncio.Future) and not fut.done():
                        fut.set_exception(LedgerRolled(act))
                self.waiters.clear()
                if self.on_roll is not None:
                    self.on_roll()

    def _heard(self, member: str, index: int, error: str) -> None:
        """A member's answer: entries through `index` durable there, or its refusal."""
        if self._closed or member in self.failed:
            return
        if error:
            self.failed.add(member)
            self._perform(self.machine.failed(member, error))
            return
        if self.through.get(member, 0) <= index:
            self.through[member] = index + 1
        if self.on_answer is not None:
            self.on_answer(member)
        self._perform(self.machine.acked_through(member, index + 1))

    def _ended(self, member: str, why: str) -> None:
        """A member's stream ended (it is stopping, or the connection broke): it takes no more entries."""
        if self._closed or member in self.failed:
            return
        self.failed.add(member)
        self._perform(self.machine.failed(member, why))

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

    def flush(self, everyone: bool = False) -> None:
        """Send every entry appended so far now (somebody waits for it) instead of after the linger — to a quorum
        (rule R4, docs/cluster.md): this node's own store, and as many of the other members as Qa needs besides,
        those with the fewest entries of their rounds unanswered first, in turn among equals; the others' copies
        follow with their next round or after the linger. Every member gets every entry, in order; a round wakes
        Qa of them, not the whole ensemble. `everyone`: to every member now."""
        m, streams, flushed = self.machine, self.streams, self._flushed
        need = m.rep.ack_quorum
        if everyone or len(streams) <= need:
            for name, st in streams.items():
                flushed[name] = m.next
                st.flush()
            return
        others = []
        for name, st in streams.items():
            if isinstance(st, LocalAppend):
                st.flush()
                need -= 1
            elif name not in self.failed:
                others.append(name)
        if need <= 0 or not others:
            return
        self._turn += 1
        k = self._turn % len(others)
        order = sorted(others[k:] + others[:k], key=lambda n: max(0, flushed.get(n, 0) - m.answered[n]))  # (stable)
        for name in order[:need]:
            flushed[name] = m.next
            streams[name].flush()

    def stop(self, why: str) -> None:
        """Roll of the writer's own accord: appends fail with LedgerRolled from now on."""
        self._perform(self.machine.stop(why))

    def resend(self) -> list[tuple[int, bytes]]:
        """After a roll: the (type, body) of the entries to append again, in order."""
        r = self.rolled
        return [] if r is None else [(self.types.get(r.close_at + i, 0), b) for i, b in enumerate(r.resend)]

    async def close(self, drain_s: float = 0.0) -> None:
        """Stop. With `drain_s`: first send every member what it was not sent yet and wait up to that long for
        the members still up to answer all that was confirmed, so a ledger closed holds it on each (a round went
        to a quorum only: R4)."""
        if drain_s > 0 and not self._closed:
            self.flush(everyone=True)
            loop = asyncio.get_running_loop()
            until = loop.time() + drain_s
            while loop.time() < until and any(self.through.get(n, 0) < self.machine.lac
                                               for n in self.streams if n not in self.failed):
                await asyncio.sleep(0.001)
        self._closed = True
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
