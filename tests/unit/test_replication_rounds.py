"""Rule R4 (docs/cluster.md, "A round goes to a quorum"), on the real LedgerWriter over streams that answer only
when told: a round goes to this node's own store and one other member, in turn — the one with fewer of its rounds'
entries unanswered first; every member still gets every entry in order; and a ledger closing sends each member
what it was not sent and waits for the answers of those that take them."""

from __future__ import annotations

import asyncio

from pigeon.cluster.quorum import Replication
from pigeon.node.append_streams import LocalAppend
from pigeon.node.replication import LedgerWriter


class Stream:
    """A member's append stream: holds what it is sent; `answer()` answers all of it (in order, as a member does)."""

    def __init__(self):
        self.sent: list[int] = []
        self.flushes = 0
        self.unsent = 0  # entries sent since the last flush (what a real stream keeps back until one, or its linger)
        self.on_answer = None
        self.closed = False

    def send(self, ledger, epoch, index, rtype, entry, where=None) -> None:
        self.sent.append(index)
        self.unsent += 1

    def flush(self) -> None:
        self.flushes += 1
        self.unsent = 0

    def follow(self, on_answer, on_end) -> None:
        self.on_answer = on_answer

    def answer(self) -> None:
        self.on_answer(self.sent[-1], "")

    def close(self) -> None:
        self.closed = True


class Own(Stream, LocalAppend):
    """This node's own store's stream (the writer tells it from the others by its class)."""

    def __init__(self):
        Stream.__init__(self)


class Client:
    def __init__(self, stream: Stream):
        self.stream, self.address = stream, "test"

    def open_append(self, channel: bool = False) -> Stream:
        return self.stream


def writer() -> tuple[LedgerWriter, dict[str, Stream]]:
    streams = {"own": Own(), "a": Stream(), "b": Stream()}
    return LedgerWriter(7, 1, {n: Client(s) for n, s in streams.items()}, Replication()), streams


def flushed(streams: dict[str, Stream]) -> dict[str, int]:
    return {n: s.flushes for n, s in streams.items()}


def test_a_round_goes_to_the_own_store_and_one_other_member_in_turn_and_every_member_gets_every_entry():
    async def run():
        w, st = writer()
        seen = []
        for i in range(4):
            w.append(3, b"x", confirmed=lambda i=i: seen.append(i))
            w.flush()
            assert st["own"].flushes == i + 1 and st["a"].flushes + st["b"].flushes == i + 1, \
                "a round goes to the own store and one other member (Qa = 2)"
            st["own"].answer()
            (st["a"] if st["a"].unsent == 0 else st["b"]).answer()
            assert seen == list(range(i + 1)), "the own store and the member it went to confirm it"
        assert st["a"].flushes == st["b"].flushes == 2, "in turn"
        assert st["a"].sent == st["b"].sent == st["own"].sent == [0, 1, 2, 3], "every member gets every entry"
        w.flush(everyone=True)
        assert st["a"].unsent == st["b"].unsent == 0
        await w.close()

    asyncio.run(run())


def test_a_round_passes_over_a_member_with_more_of_its_rounds_unanswered():
    async def run():
        w, st = writer()
        confirmed = []
        w.append(3, b"0", confirmed=lambda: confirmed.append(0))
        w.flush(everyone=True)
        st["own"].answer()
        st["b"].answer()  # "a" answers nothing from now on (paused, say)
        assert confirmed == [0]
        for i in range(1, 5):
            w.append(3, b"x", confirmed=lambda i=i: confirmed.append(i))
            w.flush()
            st["own"].answer()
            st["b"].answer()
        assert st["a"].flushes == 1 and st["b"].flushes == 5, "the member behind is not the one a round waits for"
        assert confirmed == [0, 1, 2, 3, 4]
        assert st["a"].sent == list(range(5)), "it is still sent every entry (they go with its linger)"
        await w.close()

    asyncio.run(run())


def test_a_ledger_closing_sends_each_member_what_it_lacks_and_waits_for_their_answers():
    async def run():
        w, st = writer()
        for i in range(4):
            w.append(3, b"x", confirmed=lambda: None)
        w.flush()
        behind = "a" if st["a"].unsent else "b"
        ahead = "b" if behind == "a" else "a"
        st["own"].answer()
        st[ahead].answer()
        assert w.machine.lac == 4 and st[behind].unsent == 4

        loop = asyncio.get_running_loop()
        loop.call_later(0.01, st[behind].answer)
        t0 = loop.time()
        await w.close(drain_s=5.0)
        assert st[behind].unsent == 0, "closing sends every member what it was not sent yet"
        assert w.through[behind] == 4, "… and waits until it answers what the ledger confirmed"
        assert loop.time() - t0 < 4.0 and all(s.closed for s in st.values())

        w2, st2 = writer()
        w2.append(3, b"0", confirmed=lambda: None)
        w2.flush(everyone=True)
        st2["own"].answer()
        st2["a"].answer()  # "b" never answers: the drain gives up on it after its time
        t0 = loop.time()
        await w2.close(drain_s=0.05)
        assert 0.04 <= loop.time() - t0 < 2.0 and all(s.closed for s in st2.values())

    asyncio.run(run())
