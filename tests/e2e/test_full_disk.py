"""End to end on a real small filesystem (a tmpfs the test mounts; skipped where mounting is not allowed): the
disk fills up under publishes. Publishes are refused with RESOURCE_EXHAUSTED saying the disk is full while pulls
and acks go on in the reserve; draining the backlog frees segments and publishing resumes by itself; a disk
filled by someone else stops the writer without losing anything, and it goes on when space returns; after
kill -9 every acknowledged publish is there and nothing acknowledged comes back."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from e2e_helpers import E2E_MARKS, ack, collect, pull_now, raw_publish

pytestmark = E2E_MARKS
MIB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); the journal's "
                    "full-disk handling is tested on a simulated disk in tests/node/test_journal_full_disk.py")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_full_disk_refuses_publishes_keeps_serving_and_recovers_by_itself(small_disk, server_factory, monkeypatch):
    monkeypatch.setenv("PIGEON_SEGMENT_BYTES", str(16 * MIB))
    monkeypatch.setenv("PIGEON_CHECKPOINT_INTERVAL_S", "1")
    log = str(small_disk.parent / "pigeon.log")  # the server's log off the small disk
    srv = server_factory(data_dir=str(small_disk / "data"), log_path=log)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", srv.address)
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, subscription = pub.topic_path("disk", "fill-topic"), sub.subscription_path("disk", "fill-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=60)

    # 1. fill: 1 MiB requests until the disk is refused
    acked_ids: list[str] = []
    refusal = None
    for i in range(200):
        try:
            acked_ids += raw_publish(pub, topic, [{"data": bytes([i % 256]) * (100 * 1024)} for _ in range(10)])
        except gexc.ResourceExhausted as e:
            refusal = e
            break
    assert refusal is not None, "the disk never filled"
    assert "is full" in refusal.message and "MiB free" in refusal.message, refusal.message
    assert len(acked_ids) >= 500  # tens of MiB went in before the high-water mark
    assert _free(small_disk) > 4 * MIB  # the reserve is still there for deliveries and acks

    # 2. consumers drain the backlog meanwhile: pulls and acks work
    got = collect(sub, subscription, len(acked_ids), timeout=120)
    assert set(got) == set(acked_ids)

    # 3. old segments go once checkpoints cover the acks: publishing resumes by itself (no restart)
    deadline = time.monotonic() + 60
    resumed = None
    while resumed is None and time.monotonic() < deadline:
        try:
            resumed = raw_publish(pub, topic, [{"data": b"after the drain"}])
        except gexc.ResourceExhausted:
            time.sleep(0.5)
    assert resumed, "publishing did not resume after the backlog was drained"

    # 4. someone else fills the disk to the last byte: publishes are refused, deliveries go on (a Deliver record
    # that finds no room is kept and written when there is: tests/node/test_journal_full_disk.py), and it all
    # goes on when the space returns
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)
    assert _free(small_disk) < MIB
    time.sleep(0.3)  # free space is looked up every 0.1 s at most
    with pytest.raises(gexc.ResourceExhausted, match="is full"):
        raw_publish(pub, topic, [{"data": b"no room"}])
    (waiting,) = pull_now(sub, subscription)
    assert waiting.message.message_id == resumed[0]
    filler.unlink()
    ack(sub, subscription, [waiting])  # answered once durable
    deadline = time.monotonic() + 10
    later = None
    while later is None:
        try:
            later = raw_publish(pub, topic, [{"data": b"later"}])
        except gexc.ResourceExhausted:
            assert time.monotonic() < deadline, "publishing did not resume once the space returned"
            time.sleep(0.2)

    # 5. kill -9 and restart: every acknowledged publish is there, nothing acknowledged comes back
    srv.kill()
    sub.close()
    srv2 = server_factory(data_dir=srv.data_dir, port=srv.port, log_path=log)
    sub = pubsub_v1.SubscriberClient()
    again = collect(sub, subscription, 1, timeout=30)
    assert list(again) == later
    assert pull_now(sub, subscription) == []
    sub.close()
    srv2.kill()
