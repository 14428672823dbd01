"""node.logs.NodeLogs' rule: a replicated entry is durable once Qa members hold it, not once the owner's own journal
does too (its copy there is a working copy, dropped when the node starts again); an entry only the journal holds —
the metadata log's, a log's Reset — is durable once the journal has it."""

from __future__ import annotations

import asyncio
import threading

from pigeon.core.bundles import META_LOG
from pigeon.node.disk import OsDisk
from pigeon.node.journal_writer import FsyncPolicy, JournalWriter
from pigeon.node.logs import NodeLogs
from pigeon.storage import records as R


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
