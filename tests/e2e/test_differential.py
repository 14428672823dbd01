"""Differential checks against Google's Pub/Sub emulator: the same calls through the official client must
give the same answers (codes, defaults, delivery) where the emulator implements the behaviour. The
documented service behaviour stays the spec: cases where the emulator is known to differ are not compared
here (the parts it skips: docs/reference.md, "The Pub/Sub model, all of it"; Google's own list:
https://cloud.google.com/pubsub/docs/emulator). Skipped when the gcloud emulator is not installed."""

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1

from pigeon.testing.server import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def emulator():
    if not shutil.which("gcloud"):
        pytest.skip("gcloud (Google's Pub/Sub emulator) is not installed")
    port = free_port()
    proc = subprocess.Popen(["gcloud", "beta", "emulators", "pubsub", "start", f"--host-port=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.3)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.skip("the emulator did not start within 60 s")
    yield f"127.0.0.1:{port}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _clients(address):
    os.environ["PUBSUB_EMULATOR_HOST"] = address
    return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()


def _scenario(address: str) -> dict:
    """Run one script of calls; return what each answered (exception type names or values)."""
    pub, sub = _clients(address)
    out = {}

    def outcome(key, fn):
        try:
            out[key] = fn()
        except exceptions.GoogleAPICallError as e:
            out[key] = type(e).__name__

    topic = pub.topic_path("diff", "diff-topic")
    subscription = sub.subscription_path("diff", "diff-sub")
    outcome("create_topic", lambda: pub.create_topic(name=topic).name)
    outcome("create_topic_again", lambda: pub.create_topic(name=topic).name)
    outcome("get_missing_topic", lambda: pub.get_topic(topic=pub.topic_path("diff", "nope")).name)
    outcome("sub_to_missing_topic", lambda: sub.create_subscription(
        name=sub.subscription_path("diff", "orphan"), topic=pub.topic_path("diff", "nope")).name)
    outcome("create_sub", lambda: sub.create_subscription(name=subscription, topic=topic).ack_deadline_seconds)
    outcome("create_sub_again", lambda: sub.create_subscription(name=subscription, topic=topic).name)
    outcome("sub_defaults", lambda: (
        lambda s: (s.ack_deadline_seconds, s.retain_acked_messages, s.enable_message_ordering))(
        sub.get_subscription(subscription=subscription)))
    outcome("pull_missing", lambda: len(sub.pull(subscription=sub.subscription_path("diff", "nope"),
                                                 max_messages=1, timeout=5).received_messages))
    for i in range(3):
        pub.publish(topic, b"m%d" % i, n=str(i)).result(timeout=10)
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        got += sub.pull(subscription=subscription, max_messages=10, timeout=5).received_messages
    out["delivered"] = sorted((m.message.data, dict(m.message.attributes)["n"]) for m in got)
    out["attempt_without_dead_letter"] = sorted({m.delivery_attempt for m in got})
    sub.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in got])
    out["after_ack"] = len(sub.pull(subscription=subscription, max_messages=10, timeout=5,
                                    return_immediately=True).received_messages)
    nack = pub.publish(topic, b"again").result(timeout=10)
    first = sub.pull(subscription=subscription, max_messages=1, timeout=5).received_messages
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[m.ack_id for m in first], ack_deadline_seconds=0)
    second = sub.pull(subscription=subscription, max_messages=1, timeout=5).received_messages
    out["nack_redelivers_same_id"] = [m.message.message_id == nack for m in list(first) + list(second)]
    sub.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in second])
    pub.delete_topic(topic=topic)
    outcome("sub_topic_after_delete", lambda: sub.get_subscription(subscription=subscription).topic)
    outcome("publish_to_deleted", lambda: pub.publish(topic, b"x").result(timeout=10))
    outcome("delete_sub", lambda: sub.delete_subscription(subscription=subscription))
    outcome("delete_sub_again", lambda: sub.delete_subscription(subscription=subscription))
    sub.close()
    return out


def test_pigeon_answers_like_the_emulator(server, emulator, monkeypatch):
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)  # restored after the test
    theirs = _scenario(emulator)
    ours = _scenario(server.address)
    assert ours == theirs
