"""Helpers for the crash and corruption tests: official clients with short retries, draining a
subscription, running `pigeon fsck`, and reading a data directory's records (with pigeon.storage)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass

from google.api_core import exceptions as gexc
from google.api_core import retry as gretry

from pigeon.core import limits
from pigeon.node.disk import OsDisk
from pigeon.storage import checkpoint
from pigeon.storage.journal import list_segments, segment_name
from pigeon.core import rawproto
from pigeon.storage import record, records
from pigeon.storage.records import RecordType

PROJECT = "crash-proj"
ID_NUM_MASK = (1 << (limits.topic_offset_bits + limits.shard_bits)) - 1  # message id → message number


def clients(address: str, monkeypatch, publish_timeout: float = 3.0, batch_messages: int = 100):
    """(publisher, subscriber) pointed at `address`. Publishes give up `publish_timeout` s after an error
    (the default retries for a minute, which would keep a killed server's futures pending)."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", address)
    from google.cloud import pubsub_v1

    retry = gretry.Retry(
        predicate=gretry.if_exception_type(gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.Aborted,
                                           gexc.InternalServerError, gexc.Unknown, gexc.ResourceExhausted,
                                           gexc.Cancelled),
        initial=0.05, maximum=0.3, multiplier=2.0, timeout=publish_timeout,
    )
    pub = pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=batch_messages, max_latency=0.005),
        publisher_options=pubsub_v1.types.PublisherOptions(retry=retry, timeout=publish_timeout),
    )
    sub = pubsub_v1.SubscriberClient()
    return pub, sub


def close_clients(pub, sub) -> None:
    try:
        pub.stop()
    except Exception:
        pass
    try:
        sub.close()
    except Exception:
        pass


def pull_now(sub, subscription: str, max_messages: int = 1000, timeout: float = 20.0):
    """One Pull with return_immediately (so nothing is leased to a call the client gave up on)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return sub.pull(
            request={"subscription": subscription, "max_messages": max_messages, "return_immediately": True},
            retry=None, timeout=timeout,
        ).received_messages


def drain(sub, subscription: str, empty_rounds: int = 3) -> list:
    """Pull until `empty_rounds` Pulls in a row return nothing; return every ReceivedMessage (not acked)."""
    out = []
    empty = 0
    while empty < empty_rounds:
        got = pull_now(sub, subscription)
        if got:
            out.extend(got)
            empty = 0
        else:
            empty += 1
    return out


def key(m) -> tuple[str, bytes, dict]:
    """(message id, data, attributes) of a PubsubMessage (proto-plus or protobuf)."""
    return m.message_id, bytes(m.data), dict(m.attributes)


def fsck(data_dir: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pigeon", "fsck", data_dir], capture_output=True, text=True,
                          timeout=timeout)


def broken_lines(cp: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in cp.stdout.splitlines() if ln.startswith("BROKEN")]


def tree_digest(data_dir: str) -> dict[str, str]:
    """Relative path → sha256 of every file under data_dir."""
    out = {}
    for root, _, files in os.walk(data_dir):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, data_dir)] = hashlib.sha256(fh.read()).hexdigest()
    return out


# --- reading a data directory -----------------------------------------------------------------------

@dataclass
class Rec:
    path: str  # segment file
    seg: int  # segment start (global position)
    at: int  # byte offset inside the file
    end: int  # byte offset after the record inside the file
    rtype: int
    payload: bytes

    @property
    def pos(self) -> int:
        return self.seg + self.at

    @property
    def body(self) -> bytes:
        """A journal record's payload without its entry header (log, epoch, offset)."""
        return bytes(record.split_entry(self.payload)[3])


def wal_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "wal")


def ck_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "checkpoints")


def segments(data_dir: str) -> list[str]:
    return [os.path.join(wal_dir(data_dir), segment_name(s)) for s in list_segments(OsDisk(), wal_dir(data_dir))]


def checkpoints(data_dir: str) -> list[str]:
    """Checkpoint files, oldest first."""
    return [os.path.join(ck_dir(data_dir), checkpoint.file_name(p))
            for p in checkpoint.list_files(OsDisk(), ck_dir(data_dir))]


def checkpoint_pos(path: str) -> int:
    return int(os.path.basename(path).split(".")[0])


def read_records(path: str, seg: int = 0) -> tuple[list[Rec], int, str | None]:
    """Every valid record of one file, the end of the valid part and the reason it ended (None if clean)."""
    with open(path, "rb") as f:
        buf = f.read()
    it = record.scan(buf, limits.record_bytes_max if path.endswith(".wal") else 1 << 40)
    recs = []
    try:
        while True:
            at, rtype, payload = next(it)
            recs.append(Rec(path, seg, at, 0, rtype, bytes(payload)))
    except StopIteration as stop:
        end, reason = stop.value
    for i, r in enumerate(recs):
        r.end = recs[i + 1].at if i + 1 < len(recs) else end
    return recs, end, reason


def wal_records(data_dir: str) -> list[Rec]:
    out = []
    for p in segments(data_dir):
        recs, _, reason = read_records(p, int(os.path.basename(p).split(".")[0]))
        assert reason is None, f"{p} is already broken ({reason})"
        out.extend(recs)
    return out


def published_in(rec: Rec) -> list[tuple[str, bytes, dict]]:
    """(message id, data, attributes) of the messages a PUBLISH record stores."""
    from google.pubsub_v1.types import PubsubMessage

    uid, shard, base = records.Publish.head(rec.body)[:3]
    out = []
    for i, raw in enumerate(rawproto.split_publish(records.Publish.request_of(rec.body))[1]):
        m = PubsubMessage.pb().FromString(raw)
        # message id = (topic uid << offset bits | offset) << shard bits | shard (the stored bytes may lack it)
        mid = str((((uid << limits.topic_offset_bits) | (base + i)) << limits.shard_bits) | shard)
        assert not m.message_id or m.message_id == mid, (m.message_id, mid)
        out.append((mid, bytes(m.data), dict(m.attributes)))
    return out


def acked_in(rec: Rec) -> tuple[int, list[int]]:
    ack = records.decode(RecordType.ACK, rec.body)
    return ack.sub, list(ack.nums)


def model(records: list[Rec], before: int | None = None) -> dict[str, tuple[bytes, dict]]:
    """Messages a subscription (created before every publish; there is one) still has to deliver when
    only the WAL records at global positions < `before` survive: published minus acked.
    Returns message id → (data, attributes)."""
    msgs: dict[int, tuple[str, bytes, dict]] = {}
    acked: set[int] = set()
    for r in records:
        if before is not None and r.pos >= before:
            break
        if r.rtype == RecordType.PUBLISH:
            for mid, data, attrs in published_in(r):
                msgs[int(mid) & ID_NUM_MASK] = (mid, data, attrs)
        elif r.rtype == RecordType.ACK:
            acked.update(acked_in(r)[1])
    return {mid: (data, attrs) for num, (mid, data, attrs) in msgs.items() if num not in acked}


def flip_bit(path: str, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes((b[0] ^ (1 << bit),)))


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def write_at(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def read_log(srv) -> str:
    with open(srv.log_path, errors="replace") as f:
        return f.read()
