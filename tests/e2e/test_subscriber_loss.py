"""End to end: a subscriber process that dies (kill -9) while its StreamingPull holds unacked messages. Once
their ack deadline passes, every message it held is delivered again to another subscriber — exactly as if it
had been pulled and not acked, with `delivery_attempt` counted under a dead-letter policy."""

import os
import subprocess
import sys
import time

import pytest

from e2e_helpers import E2E_MARKS, collect, pull_now, raw_publish, topic_and_subscription

pytestmark = E2E_MARKS

P = "loss-proj"
CHILD = os.path.join(os.path.dirname(__file__), "subscriber_child.py")


def _subscriber_holding(server, subscription: str, count: int, timeout: float = 30.0) -> tuple[subprocess.Popen, set]:
    """Start a subscriber process; return it once it holds `count` messages (and the ids it holds)."""
    child = subprocess.Popen([sys.executable, CHILD, server.address, subscription],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    held: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(held) < count:
            assert time.monotonic() < deadline, f"the subscriber process received {len(held)} of {count}"
            line = child.stdout.readline()
            assert line, f"the subscriber process exited ({child.poll()}) holding {len(held)} of {count}"
            held.add(line.strip())
    except BaseException:
        child.kill()
        child.wait()
        raise
    return child, held


@pytest.mark.parametrize("dead_letter", [False, True], ids=["plain", "dead-letter-policy"])
def test_messages_of_a_killed_streaming_subscriber_are_redelivered(clients, server, dead_letter):
    pub, sub = clients
    fields = {"ack_deadline_seconds": 10}
    if dead_letter:
        dlq = pub.topic_path(P, "held-dlq")
        pub.create_topic(name=dlq)
        fields["dead_letter_policy"] = {"dead_letter_topic": dlq, "max_delivery_attempts": 5}
    topic, subscription = topic_and_subscription(pub, sub, "held", project=P, **fields)
    ids = set(raw_publish(pub, topic, [{"data": f"m{i}".encode()} for i in range(20)]))

    child, held = _subscriber_holding(server, subscription, len(ids))
    assert held == ids
    child.kill()  # SIGKILL: the stream drops with 20 messages leased to it
    child.wait()

    # the client extended the leases by 10 s at a time; after that they run out and the messages come back
    again = collect(sub, subscription, len(ids), timeout=40)
    assert set(again) == ids
    if dead_letter:
        assert {r.delivery_attempt for r in again.values()} == {2}
    else:
        assert {r.delivery_attempt for r in again.values()} == {0}  # not counted without a dead-letter policy


def test_graceful_shutdown_hands_back_what_it_did_not_process(clients, server):
    """A subscriber with FlowControl(max_messages=5) and three callback threads is cancelled while three
    callbacks run; it waits for them (they ack) and nacks what it held but had not started. A second subscriber
    then receives exactly the 7 unprocessed messages, long before the 60 s ack deadline would free them."""
    import concurrent.futures
    import threading

    from google.cloud import pubsub_v1
    from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

    pub, sub = clients
    topic, subscription = topic_and_subscription(pub, sub, "graceful", project=P, ack_deadline_seconds=60)
    ids = raw_publish(pub, topic, [{"data": f"m{i}".encode()} for i in range(10)])

    running, acked, release = [], [], threading.Event()
    lock = threading.Lock()

    def callback(message):
        with lock:
            running.append(message.message_id)
        release.wait(30)
        message.ack()
        with lock:
            acked.append(message.message_id)

    first = pubsub_v1.SubscriberClient()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=3)
    future = first.subscribe(subscription, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=5),
                             scheduler=ThreadScheduler(pool), await_callbacks_on_shutdown=True)
    deadline = time.monotonic() + 15
    while len(running) < 3:
        assert time.monotonic() < deadline, f"{len(running)} callbacks started"
        time.sleep(0.05)
    time.sleep(0.5)  # the two messages beyond the three threads arrive and wait in the scheduler's queue
    assert len(running) == 3  # three threads: the rest waits
    future.cancel()  # stops the stream; the shutdown waits for the running callbacks
    time.sleep(0.3)
    release.set()
    future.result(timeout=30)
    first.close()
    assert len(acked) == 3

    again = collect(sub, subscription, 7, timeout=10)
    assert set(again) == set(ids) - set(acked)
    time.sleep(1)  # nothing else comes: the acked three stay acked
    assert not [r for r in pull_now(sub, subscription) if r.message.message_id in acked]
