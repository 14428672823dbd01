"""Replication over the storage service, end to end on loopback: three storage members (each a ledger store
behind a real gRPC server), an owner writing a ledger through them, a member stopped mid-stream, and a new owner
fencing and recovering the ledger. Checks: an append is answered once Qa members have it; a failing member rolls
the ledger without losing a confirmed entry; recovery closes at or past every confirmed entry with the right
bytes on the members that remain; the old owner's later appends are refused by the fence."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pigeon.api import storage_api
from pigeon.cluster.quorum import Replication
from pigeon.core import limits
from pigeon.node import append_channel
from pigeon.node.ledger_store import LedgerStore
from pigeon.node.replication import LedgerRolled, LedgerWriter, StorageClient, recover_ledger
from pigeon.bench.procs import free_port


class Member:
    """A storage member: its ledger store behind a gRPC server and an append channel, as a node serves it."""

    def __init__(self, data_dir: str):
        self.store = LedgerStore(data_dir)
        self.server: grpc.aio.Server | None = None
        self.channel: append_channel.ChannelServer | None = None
        self.address = self.appends_at = ""

    async def start(self) -> "Member":
        await self.store.open()
        self.server = grpc.aio.server(options=[  # as a node's server (pigeon.api.server)
            ("grpc.max_receive_message_length", limits.grpc_receive_bytes_max),
            ("grpc.max_send_message_length", limits.grpc_receive_bytes_max)])
        self.server.add_generic_rpc_handlers(storage_api.handlers(self.store))
        port = free_port()
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{port}"
        await self.server.start()
        sock = append_channel.listen("127.0.0.1", 0)
        self.appends_at = f"127.0.0.1:{sock.getsockname()[1]}"
        self.channel = await append_channel.serve(sock, self.store)
        return self

    def client(self, transport: str) -> StorageClient:
        """A client of this member whose ledger writers append over `transport` ("grpc" or "channel")."""
        c = StorageClient(self.address)
        if transport == "channel":
            c.append_at = self.appends_at
        return c

    async def stop(self) -> None:
        self.channel.close()
        await self.server.stop(0)
        await self.store.close()


def body(i: int) -> bytes:
    return b"entry-%d" % i


TRANSPORTS = pytest.mark.parametrize("transport", ["grpc", "channel"])


@TRANSPORTS
def test_a_ledger_survives_a_member_and_its_writer(tmp_path, transport):
    async def run():
        members = {f"m{i}": await Member(str(tmp_path / f"m{i}")).start() for i in range(3)}
        clients = {m: x.client(transport) for m, x in members.items()}
        rep = Replication()  # E = Qw = 3, Qa = 2
        w = LedgerWriter(42, 1, clients, rep)
        done = await asyncio.gather(*[w.append(3, body(i)) for i in range(50)])
        assert done == list(range(50)), "each append answered once Qa members have it"
        holders = [m for m, x in members.items() if [e.body for e in x.store.read(42, 0, 50)] ==
                   [body(i) for i in range(50)]]
        assert len(holders) >= 2, f"confirmed entries are on Qa members: {holders}"

        more = [w.append(3, body(i)) for i in range(50, 80)]  # in flight while a member goes away
        await members["m2"].stop()
        results = await asyncio.gather(*more, return_exceptions=True)
        confirmed = 50 + sum(1 for r in results if not isinstance(r, BaseException))
        assert all(isinstance(r, LedgerRolled) for r in results[confirmed - 50:]), "confirmed entries are a prefix"
        for _ in range(100):  # Qa = 2 members may confirm everything before the stopped one's stream breaks
            if w.rolled is not None:
                break
            await asyncio.sleep(0.05)
        assert w.rolled is not None, "a stopped member rolls the ledger"
        assert w.rolled.close_at == confirmed
        assert [b for _, b in w.resend()] == [body(i) for i in range(confirmed, 80)]
        with pytest.raises(LedgerRolled):
            w.append(3, b"after the roll")

        # a new owner recovers the ledger: m2 is down, the other two answer
        end = await recover_ledger(42, clients, rep)
        assert end >= confirmed
        for m in ("m0", "m1"):
            assert [e.body for e in members[m].store.read(42, 0, end)] == [body(i) for i in range(end)]
            assert members[m].store.fenced(42)

        # the old owner, writing on to the members that are up (a retry of its first entry, as after a
        # reconnect), is refused by the fence
        w2 = LedgerWriter(42, 1, {m: clients[m] for m in ("m0", "m1")}, Replication(2, 2, 2))
        with pytest.raises(LedgerRolled, match="ledger 42 is fenced"):
            await w2.append(3, body(0))
        assert all(len(members[m].store.read(42, 0, 1000)) == end for m in ("m0", "m1")), "nothing late was taken"
        await w.close()
        await w2.close()
        for c in clients.values():
            await c.close()
        for m in ("m0", "m1"):
            await members[m].stop()

    asyncio.run(run())


class Silent:
    """A member cut off by the network: it takes entries and never answers nor fails."""

    address = "silent"

    def open_append(self, channel: bool = False):
        return self

    def send(self, *entry) -> None:
        pass

    def flush(self) -> None:
        pass

    def follow(self, on_answer, on_end) -> None:
        pass  # (nothing is ever answered, nor does the stream end)

    def close(self) -> None:
        pass


def test_a_silent_member_rolls_the_ledger(tmp_path, monkeypatch):
    """A member that neither answers nor fails (a cut-off peer) would hold the writer's unconfirmed tail for as
    long as the cut lasts; after member_silence_s it counts as failed and the ledger rolls, keeping what Qa
    others confirmed."""
    from pigeon.core import limits

    monkeypatch.setattr(limits, "member_silence_s", 0.4)

    async def run():
        members = {f"m{i}": await Member(str(tmp_path / f"m{i}")).start() for i in range(2)}
        clients = {**{m: StorageClient(x.address) for m, x in members.items()}, "cut": Silent()}
        w = LedgerWriter(7, 1, clients, Replication())
        assert await asyncio.gather(*[w.append(3, body(i)) for i in range(20)]) == list(range(20))
        assert w.rolled is None, "two members answering confirm entries; the silent one is not yet late"
        for _ in range(100):
            if w.rolled is not None:
                break
            await asyncio.sleep(0.05)
        assert w.rolled is not None and "cut failed: no answer in 0.4 s" in w.rolled.why
        assert w.rolled.close_at == 20 and w.resend() == []
        assert w.failed == {"cut"}
        await w.close()
        for x in members.values():
            await x.stop()

    asyncio.run(run())


@TRANSPORTS
def test_megabyte_entries_appended_at_once_fit_the_members_messages(tmp_path, transport):
    """Thirty 1 MB records appended in one turn of the loop (a publish burst): the writer sends them in requests
    a member takes (32 MB in one request passed its largest message: refused, rolled, resent, refused … without
    end), and a new owner reads them back in answers that fit."""
    async def run():
        members = {f"m{i}": await Member(str(tmp_path / f"m{i}")).start() for i in range(3)}
        clients = {m: x.client(transport) for m, x in members.items()}
        big = [bytes([i]) * (1024 * 1024) for i in range(30)]
        w = LedgerWriter(9, 1, clients, Replication())
        done = await asyncio.wait_for(asyncio.gather(*[w.append(3, b) for b in big]), 60)
        assert done == list(range(30)) and w.rolled is None
        await w.close()
        # answered at Qa = 2: the third member may still be behind (it was, once, on a busy machine); read as a
        # new owner would, from members that hold them
        holder = next(m for m, x in members.items() if x.store.read(9, 29, 30))  # the last one durable there
        read, start = [], 0
        while start < 30:
            got = await clients[holder].read(9, start, 30)
            assert got and sum(len(b) for _, b in got) <= max(limits.storage_message_bytes_max, len(got[0][1]))
            read.extend(b for _, b in got)
            start += len(got)
        assert read == big
        for c in clients.values():
            await c.close()
        for m in members.values():
            await m.stop()

    asyncio.run(run())


def test_recovery_counts_its_own_store_refusing_as_that_member_gone(tmp_path):
    """This node's own ledger store is a member called in process: it refuses with Pigeon's errors, not gRPC's
    (here a fence of a ledger it deleted). Recovery counts that member gone and decides with the others, instead
    of waiting for an answer that never comes (every member must answer here: Qa = 3)."""
    from pigeon.node.replication import LocalMember

    async def run():
        own = LedgerStore(str(tmp_path / "own"))
        await own.open()
        members = {f"m{i}": await Member(str(tmp_path / f"m{i}")).start() for i in (1, 2)}
        for i in range(20):
            await own.append(42, 1, i, 1, body(i))
            for x in members.values():
                await x.store.append(42, 1, i, 1, body(i))
        await own.delete([42])
        clients = {"me": LocalMember(own), **{m: StorageClient(x.address) for m, x in members.items()}}
        assert await asyncio.wait_for(recover_ledger(42, clients, Replication(3, 3, 3)), 10) == 20
        for c in clients.values():
            await c.close()
        for x in members.values():
            await x.stop()
        await own.close()

    asyncio.run(run())


def test_the_owners_own_copy_of_entries_nobody_waits_for_rides_with_the_next_flush(tmp_path, monkeypatch):
    """Deliveries and acks on streams are records nobody waits for: they linger before they go to the remote
    members, and this node's own copy must not cost a group commit (a wake-up of its journal's writer and an
    fdatasync) of its own for each either — a cluster owner's CPU per message at low rates went mostly there.
    Such entries are written but not fdatasync'd until an entry somebody waits for (`flush`) comes, and then all
    share one fdatasync; entries nobody ever flushes are still answered, by the journal's lazy flush."""
    from pigeon.node.append_streams import LocalAppend

    async def written(store, before: int) -> None:
        while store.writer.statistics().group_commits == before:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # (a writer asked to sync would have by now)

    async def run():
        own = LedgerStore(str(tmp_path))
        await own.open()
        stream = LocalAppend(own)
        answers = stream.answers()
        syncs = own.writer.statistics().syncs
        monkeypatch.setattr(limits, "lazy_flush_s", 60.0)
        for i in range(5):
            commits = own.writer.statistics().group_commits
            stream.send(42, 1, i, 1, body(i))
            await asyncio.wait_for(written(own, commits), 10)
            assert own.writer.statistics().syncs == syncs, f"entry {i} was fdatasync'd on its own"
        stream.send(42, 1, 5, 1, body(5))
        stream.flush()
        assert [await asyncio.wait_for(answers.__anext__(), 10) for _ in range(6)] == [(i, "") for i in range(6)]
        assert own.writer.statistics().syncs == syncs + 1
        assert own.held(42) == 6
        monkeypatch.setattr(limits, "lazy_flush_s", 0.01)
        stream.send(42, 1, 6, 1, body(6))  # never flushed: the lazy flush makes it durable all the same
        assert await asyncio.wait_for(answers.__anext__(), 10) == (6, "")
        assert own.writer.statistics().syncs == syncs + 2
        stream.close()
        await own.close()

    asyncio.run(run())


def test_a_member_whose_session_ended_and_does_not_answer_holds_no_recovery(tmp_path):
    """A paused member neither answers nor refuses: a recovery would wait a call's whole deadline for its fence
    (limits.storage_call_s). One whose session has ended (`ended`: the taker's view) counts as gone after
    limits.recovery_ended_s, and the others decide, as they would were it dead; one whose session is live is
    waited for."""
    from pigeon.core import limits

    class Paused:
        async def fence(self, ledger):
            await asyncio.sleep(3600)

        async def close(self):
            pass

    async def run():
        live = await Member(str(tmp_path / "m1")).start()
        for i in range(20):
            await live.store.append(42, 1, i, 1, body(i))
        clients = {"m1": StorageClient(live.address), "paused": Paused()}
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await asyncio.wait_for(recover_ledger(42, clients, Replication(2, 2, 2), frozenset({"paused"})),
                                      10) == 20
        assert loop.time() - t0 < limits.storage_call_s / 2 and live.store.fenced(42)
        with pytest.raises(asyncio.TimeoutError):  # (its session live: it may answer yet)
            await asyncio.wait_for(recover_ledger(42, clients, Replication(2, 2, 2)), 1.0)
        await clients["m1"].close()
        await live.stop()

    asyncio.run(run())


def test_a_member_whose_session_ended_fails_at_once(tmp_path):
    """A paused member neither answers nor refuses: the writer would hold every append for limits.member_silence_s
    before rolling. Told that its session ended (BundleLogs.members_ended), the writer fails it at once: the ledger
    rolls, the appends waiting go to the next one."""
    async def run():
        members = {f"m{i}": await Member(str(tmp_path / f"m{i}")).start() for i in range(3)}
        clients = {m: x.client("channel") for m, x in members.items()}
        w = LedgerWriter(42, 1, clients, Replication())
        assert await asyncio.gather(*[w.append(3, body(i)) for i in range(5)]) == list(range(5))
        waiting = w.append(3, body(5))
        w.member_gone("m2", "its session ended")
        assert w.rolled is not None and "m2" in w.failed
        with pytest.raises(LedgerRolled):
            await waiting
        w.member_gone("m1", "twice")  # (after the roll: nothing more)
        assert "m1" not in w.failed
        await w.close()
        for c in clients.values():
            await c.close()
        for x in members.values():
            await x.stop()

    asyncio.run(run())


def test_the_owners_own_copy_answers_in_order_from_its_group_commits(tmp_path):
    """The owner's own store followed (LocalAppend.follow) is answered from its group commit's callback, in order,
    the last durable entry standing for those before it; an entry it refuses is answered after every entry before
    it, and nothing after that."""
    from pigeon.node.append_streams import LocalAppend

    async def until(cond) -> None:
        for _ in range(1000):
            if cond():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("not answered")

    async def run():
        own = LedgerStore(str(tmp_path))
        await own.open()
        stream, answers, ended = LocalAppend(own), [], []
        stream.follow(lambda index, error: answers.append((index, error)), ended.append)
        for i in range(3):
            stream.send(42, 1, i, 1, body(i))
        stream.flush()
        await until(lambda: answers and answers[-1][0] == 2)
        assert all(error == "" for _, error in answers) and [i for i, _ in answers] == sorted({i for i, _ in answers})
        stream.send(42, 1, 3, 1, body(3))
        stream.send(42, 1, 9, 1, body(9))  # a gap: refused, but only after entry 3 is answered
        stream.send(42, 1, 4, 1, body(4))
        stream.flush()
        await until(lambda: answers[-1][0] == 9)
        assert answers[-2] == (3, "") and "gap" in answers[-1][1]
        await asyncio.sleep(0.05)
        assert answers[-1][0] == 9 and ended == []
        stream.close()
        await own.close()

    asyncio.run(run())


def test_an_entry_appended_with_a_callback_is_confirmed_through_it_and_left_alone_by_a_roll(tmp_path):
    """LedgerWriter.append(confirmed=…): the callback runs once Qa members hold the entry (no future between the
    member's answer and the caller); when the ledger rolls first it is not called — the caller, told by on_roll,
    sends the entry to the next ledger — while a future appended beside it fails with LedgerRolled."""
    from pigeon.node.replication import LocalMember

    async def run():
        own = LedgerStore(str(tmp_path))
        await own.open()
        w = LedgerWriter(5, 1, {"me": LocalMember(own)}, Replication(1, 1, 1))
        confirmed = asyncio.Event()
        assert w.append(3, body(0), confirmed=confirmed.set) is None
        w.flush()
        await asyncio.wait_for(confirmed.wait(), 10)
        await w.close()

        rolls, called = [], []
        w = LedgerWriter(6, 1, {"me": LocalMember(own), "cut": Silent()}, Replication(2, 2, 2))
        w.on_roll = lambda: rolls.append(w.rolled.why)
        w.append(3, body(0), confirmed=lambda: called.append(0))
        fut = w.append(3, body(1))
        w.flush()
        await asyncio.sleep(0.05)  # the own copy answers; the silent member never does: nothing is confirmed
        assert called == [] and not fut.done()
        w.stop("moved away")
        with pytest.raises(LedgerRolled):
            await fut
        assert called == [] and rolls == ["moved away"] and w.resend() == [(3, body(0)), (3, body(1))]
        await w.close()
        await own.close()

    asyncio.run(run())


def test_the_owners_own_copy_never_answers_an_entry_whose_commit_was_cancelled(tmp_path, monkeypatch):
    """A group commit's future cancelled (its store closing) answers nothing for its entries — they are not durable —
    and ends the stream, after answering the entries durable before them."""
    from pigeon.node.replication import LocalAppend

    async def run():
        own = LedgerStore(str(tmp_path))
        await own.open()
        stream, answers, ended = LocalAppend(own), [], []
        stream.follow(lambda index, error: answers.append((index, error)), ended.append)
        stream.send(42, 1, 0, 1, body(0))
        stream.flush()
        for _ in range(1000):
            if answers:
                break
            await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        never = loop.create_future()
        monkeypatch.setattr(own, "submit", lambda *a, **k: never)
        stream.send(42, 1, 1, 1, body(1))
        never.cancel()
        await asyncio.sleep(0.05)
        assert answers == [(0, "")] and ended == [stream.why_ended]
        stream.close()
        await own.close()

    asyncio.run(run())
