"""node.logs.NodeLogs' rule: a replicated entry is durable once Qa members hold it, not once the owner's own journal
does too (its copy there is a working copy, dropped when the node starts again); an entry only the journal holds —
the metadata log's, a log's Reset — is durable once the journal has it."""

from __future__ import annotations

import asyncio
import threading

from pigeon.core import limits
from pigeon.core.bundles import META_LOG
from pigeon.node.disk import OsDisk
from pigeon.node.journal_writer import FsyncPolicy, JournalWriter
from pigeon.node.logs import NodeLogs
from pigeon.storage import records as R
from pigeon.testing import simloop


class _HeldDisk(OsDisk):
    """Every group commit waits for `go`: the journal is not durable until the test says."""

    def __init__(self):
        super().__init__()
        self.go = threading.Event()

    def commit(self, *args):
        self.go.wait(10)
        return super().commit(*args)


class _Ledgers:
    """The replication of a bundle's log: the test confirms each entry by hand (Qa members answering)."""

    def __init__(self):
        self.sent: list[asyncio.Future] = []

    def append(self, log_id, rtype, body, where) -> asyncio.Future:
        self.sent.append(asyncio.get_running_loop().create_future())
        return self.sent[-1]

    def flush(self, log_id) -> None:
        pass

    def when_confirmed(self, log_id) -> asyncio.Future | None:
        """Done with the latest entry sent (BundleLogs settles it in the step that confirms that entry)."""
        fut = asyncio.get_running_loop().create_future()
        self.sent[-1].add_done_callback(lambda f: fut.done() or fut.set_result(None))
        return fut


def test_a_replicated_entry_is_durable_once_qa_hold_it_while_the_journal_has_not_synced(tmp_path):
    async def run():
        disk = _HeldDisk()
        journal = JournalWriter(str(tmp_path / "wal"), FsyncPolicy.always, 1 << 20, disk)
        journal.open(0, {})
        logs, ledgers = NodeLogs(journal), _Ledgers()
        logs.replicate_with(ledgers)
        _, _ = logs.append(5, 1, R.RecordType.PUBLISH, [b"a message"])
        end = journal.tail
        waiting = asyncio.ensure_future(logs.durable(end, 5))
        await asyncio.sleep(0.05)
        assert not waiting.done(), "not before Qa members hold it"
        ledgers.sent[-1].set_result(None)
        await asyncio.wait_for(waiting, 2)
        assert journal.durable < end, "answered without waiting for the owner's journal"

        logs.append(META_LOG, 1, R.RecordType.PUBLISH, [b"the metadata log's"])
        logs.append(5, 1, R.RecordType.PUBLISH, [b"another"])
        local = asyncio.ensure_future(logs.durable(journal.tail, 5))
        ledgers.sent[-1].set_result(None)
        await asyncio.sleep(0.05)
        assert not local.done(), "an entry only the journal holds lies below: it waits for the journal"
        disk.go.set()
        await asyncio.wait_for(local, 5)
        assert journal.durable >= journal.tail
        await journal.close()

    asyncio.run(run())


class _Journal:
    """Just enough of a journal for NodeLogs' appends (the rounds below never wait for it)."""

    def __init__(self):
        self.tail = 0

    def append(self, log_id, epoch, rtype, parts):
        self.tail += 1
        return self.tail - 1, self.tail - 1


class _Rounds(_Ledgers):
    """Notes when each round goes out (a flush of the log's lingering entries)."""

    def __init__(self):
        super().__init__()
        self.at: list[float] = []

    def flush(self, log_id) -> None:
        self.at.append(asyncio.get_running_loop().time())


def test_under_load_a_round_waits_for_the_last_to_be_held_at_most_a_spacing_and_otherwise_goes_at_once():
    """Under load (the last round still out, and itself asked for while the one before was out) a round goes once
    the last is held by Qa members, and no later than limits.replication_round_s after the last went; a burst's
    second round, and any round after an answered one, at once."""
    round_s = limits.replication_round_s
    assert round_s > 0

    async def go():
        loop = asyncio.get_running_loop()
        logs, rounds = NodeLogs(_Journal()), _Rounds()
        logs.replicate_with(rounds)

        def publish() -> None:  # a record appended, and somebody waiting for it
            logs.append(5, 1, R.RecordType.PUBLISH, [b"a message"])
            assert logs.recording(5) is not None

        start = loop.time()
        publish()
        await asyncio.sleep(0)
        assert rounds.at == [start], "the first round goes once the callbacks readied so far have run"

        publish()
        await asyncio.sleep(0)
        assert rounds.at == [start, start], "a burst's second round goes at once, beside the first still out"

        publish()
        publish()  # (both wait for the same round)
        await asyncio.sleep(round_s / 2)
        assert len(rounds.at) == 2, "under load a round waits until a round after the last"
        await asyncio.sleep(round_s)
        assert rounds.at[2] == start + round_s, "… and then goes, with everything appended meanwhile"

        rounds.sent[-1].set_result(None)  # Qa members hold the last round
        answered = loop.time()
        publish()
        await asyncio.sleep(0)
        assert rounds.at[-1] == answered, "the last round answered: the next goes at once, however soon"

        await asyncio.sleep(round_s / 4)
        publish()  # a burst's second round: at once
        await asyncio.sleep(0)
        assert len(rounds.at) == 5
        publish()  # under load again: waits …
        await asyncio.sleep(round_s / 4)
        assert len(rounds.at) == 5, "under load a round waits for the last to be held"
        rounds.sent[-3].set_result(None)  # (the burst's first round held: not the last)
        await asyncio.sleep(round_s / 100)
        assert len(rounds.at) == 5, "… the last, not only one before it"
        rounds.sent[-2].set_result(None)  # (the burst's second round: the last)
        held = loop.time()
        await asyncio.sleep(round_s / 100)
        assert rounds.at[5] == held < rounds.at[4] + round_s, "… and goes once it is, before the spacing is up"
        await asyncio.sleep(2 * round_s)
        assert len(rounds.at) == 6, "one round for that wait, not a second when its timer would have come"

    simloop.run(go())
