"""An owner that lost its bundle without knowing it — paused past its session while another node took the bundle
over — hands out nothing once it runs again, not even a message the new owner has since seen acknowledged: its
delivery's lease would have to be confirmed by the members of its ledger, which the new owner fenced. (Before,
it handed the messages of its stale state to the streams it still held the moment it ran again, and an ack that
had been answered OK through the new owner looked undone to the subscriber.)"""

from __future__ import annotations

import queue
import signal
import threading
import time

import pytest

from pigeon.testing.cluster import await_status, clients_of, owners, topic_owned_by

pytestmark = pytest.mark.e2e

P = "projects/stale-owner"


def test_a_paused_owner_resumed_hands_out_no_message_acknowledged_meanwhile(three_nodes, etcd):
    from google.pubsub_v1 import StreamingPullRequest

    topic = topic_owned_by(owners(etcd.endpoint), "n1", f"{P}/topics/stale")
    pub, on_n1 = clients_of(three_nodes["n1"])  # the stream goes to n1 itself: nothing forwards it
    _, on_n2 = clients_of(three_nodes["n2"])
    name = f"{P}/subscriptions/stale"
    pub.create_topic(name=topic)
    on_n1.create_subscription(name=name, topic=topic, ack_deadline_seconds=10)
    mid = pub.publish(topic, b"once").result(timeout=30)

    got: queue.Queue = queue.Queue()
    ended = threading.Event()

    def requests():
        yield StreamingPullRequest(subscription=name, stream_ack_deadline_seconds=10, max_outstanding_messages=10)
        ended.wait(120)

    stream = on_n1.streaming_pull(requests=requests(), timeout=120)

    def read():
        try:
            for resp in stream:
                for m in resp.received_messages:
                    got.put((time.monotonic(), m))
        except Exception:  # noqa: BLE001 — the stream ended (cancelled, or the bundle moved)
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        delivered, first = got.get(timeout=30)
        assert first.message.message_id == mid
        time.sleep(0.5)  # its Deliver record reaches the members (an entry nobody waits for lingers a moment)

        n1 = three_nodes["n1"].proc
        n1.send_signal(signal.SIGSTOP)
        try:
            await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and not any(
                r["node"] == "n1" and r["bundles"] for r in st["nodes"]), timeout=60, what="n1's bundles to move")
            # the new owner knows n1's delivery (its lease is in the log): given back, pulled again, acknowledged
            on_n2.modify_ack_deadline(subscription=name, ack_ids=[first.ack_id], ack_deadline_seconds=0)
            deadline = time.monotonic() + 30
            again = []
            while not again and time.monotonic() < deadline:
                again = on_n2.pull(subscription=name, max_messages=10, timeout=10).received_messages
            assert [m.message.message_id for m in again] == [mid]
            on_n2.acknowledge(subscription=name, ack_ids=[again[0].ack_id])
            acked = time.monotonic()
            # n1's own lease of the message runs out while it is stopped: resumed, its stale state would hand it
            # to the stream it still holds at once
            time.sleep(max(0.0, delivered + 11 - time.monotonic()))
        finally:
            n1.send_signal(signal.SIGCONT)
        late = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                late.append(got.get(timeout=0.2))
            except queue.Empty:
                pass
        assert not late, (f"the resumed owner handed out {[m.message.message_id for _, m in late]} "
                          f"{late[0][0] - acked:.1f} s after the ack was answered through the new owner")
        # and the new owner keeps it acknowledged
        assert not on_n2.pull(subscription=name, max_messages=10, timeout=3).received_messages
    finally:
        ended.set()
        stream.cancel()
        reader.join(timeout=10)
