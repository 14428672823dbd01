"""The machine as a node sees it: its disks, the lock on its data directory, its journals' writers, the
connections it opens to peers and the probe that tells a dead peer from a slow one. Owns no rule: it is the one
place a node's code reaches the operating system through, so the cluster simulator (pigeon.testing.simcluster)
can run the same code over simulated disks, journals and a simulated network by passing a host of its own.

`OsHost` is the real machine: files through node.disk.OsDisk, a journal written by a thread of its own
(node.journal_writer.JournalWriter), peers over gRPC (node.replication.StorageClient), a refused TCP connection as the
sign of a dead peer."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time


class DataDirInUse(Exception):
    pass


class OsHost:
    def __init__(self):
        from pigeon.node.disk import OsDisk

        self.disk = OsDisk()  # the node's own files: its journal (deliveries read it back), checkpoints, ids
        self.cold_disk = OsDisk(drop_synced=True)  # files read back only to recover: not worth the page cache

    def lock_data_dir(self, data_dir: str):
        """Take the data directory for this process (an exclusive lock on <data dir>/LOCK, released when the
        process ends, however it ends): two processes on one directory would corrupt it. DataDirInUse when another
        has it. What to close to let it go."""
        f = open(os.path.join(data_dir, "LOCK"), "a+")
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a POSIX lock: per process, as the rule is
        except OSError:
            f.close()
            raise DataDirInUse(f"the data directory {data_dir} is in use by another process") from None
        return f

    def journal(self, directory: str, policy, segment_bytes: int, disk=None):
        """A journal's writer over `disk` (the node's own by default)."""
        from pigeon.node.journal_writer import JournalWriter

        return JournalWriter(directory, policy, segment_bytes, disk or self.disk)

    def cpu_time(self) -> float:
        """CPU seconds this process has used (every thread): what the load meter (node.bundle_load) shares out."""
        return time.process_time()

    def storage_client(self, address: str, config):
        """A peer's storage service (ledgers), as an owner calls it."""
        from pigeon.node.replication import StorageClient

        return StorageClient(address, config)

    async def refuses(self, address: str, timeout: float) -> bool:
        """Whether `address` refuses a TCP connection — only a port nothing listens on does (its process is gone);
        a connection that times out or is accepted says no."""
        host, _, port = address.rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
        except ConnectionRefusedError:
            return True
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        return False
