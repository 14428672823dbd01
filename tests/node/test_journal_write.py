"""The journal writer's gathered writes (node.disk.OsDisk.writev): every record lands in order, past writev's
buffer limit and after a partial write."""

import os

from pigeon.node import disk as wal


def _records(n):
    return [bytes([i % 251]) * (1 + i % 97) for i in range(n)]


def test_more_records_than_one_writev_takes(tmp_path):
    path = tmp_path / "seg"
    chunks = _records(3 * wal._IOV_MAX + 5)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        wal.OsDisk().writev(fd, chunks)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(chunks)


def test_a_partial_write_is_finished_byte_exactly(tmp_path, monkeypatch):
    path = tmp_path / "seg"
    chunks = _records(2500)
    real_writev = os.writev
    calls = []

    def short_writev(fd, buffers):  # the kernel may stop early (a signal, a full disk about to fail)
        calls.append(len(buffers))
        data = b"".join(buffers)
        return os.write(fd, data[: len(data) // 3]) if len(calls) == 2 else real_writev(fd, buffers)

    monkeypatch.setattr(wal.os, "writev", short_writev)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        wal.OsDisk().writev(fd, chunks)
    finally:
        os.close(fd)
    assert calls == [wal._IOV_MAX, wal._IOV_MAX, 2500 - 2 * wal._IOV_MAX]
    assert path.read_bytes() == b"".join(chunks)
