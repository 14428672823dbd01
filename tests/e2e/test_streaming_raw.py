"""End to end: StreamingPull driven through the generated client's raw bidi stream (as non-Python clients
use it): server-side flow control (max_outstanding_messages), acks and nacks sent on the stream."""

import functools
import queue
import threading
import time

from google.api_core import exceptions as gexc
from google.pubsub_v1 import types
from google.pubsub_v1.services.subscriber import SubscriberClient as GapicSubscriber

from e2e_helpers import topic_and_subscription, E2E_MARKS, raw_publish

pytestmark = E2E_MARKS

P = "raw-proj"


class RawStream:
    """One StreamingPull: `send` requests, `take(n)` received messages (with a timeout)."""

    def __init__(self, sub, first: dict):
        self.requests: queue.Queue = queue.Queue()
        self.messages: queue.Queue = queue.Queue()
        self.error = None
        self.requests.put(types.StreamingPullRequest(**first))
        self.responses = GapicSubscriber.streaming_pull(sub, requests=self._gen(), retry=None, timeout=60)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _gen(self):
        while True:
            r = self.requests.get()
            if r is None:
                return
            yield r

    def _read(self):
        try:
            for resp in self.responses:
                for rm in resp.received_messages:
                    self.messages.put(rm)
        except Exception as e:  # noqa: BLE001 - handed to the test
            self.error = e
        finally:
            self.messages.put(None)

    def send(self, **fields):
        self.requests.put(types.StreamingPullRequest(**fields))

    def take(self, n: int, timeout: float) -> list:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rm = self.messages.get(timeout=left)
            except queue.Empty:
                break
            if rm is None:
                self.messages.put(None)
                break
            out.append(rm)
        return out

    def close(self):
        self.requests.put(None)
        try:
            self.responses.cancel()
        except Exception:
            pass
        self.reader.join(timeout=10)


_setup = functools.partial(topic_and_subscription, project=P)


def test_stream_respects_max_outstanding_messages(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "flow")
    ids = raw_publish(pub, topic, [{"data": f"m{i}".encode()} for i in range(10)])
    s = RawStream(sub, {"subscription": subscription, "stream_ack_deadline_seconds": 60,
                        "max_outstanding_messages": 3, "client_id": "raw-flow"})
    try:
        first = s.take(10, timeout=1.5)
        assert len(first) == 3, f"server sent {len(first)} messages with max_outstanding_messages=3"
        # an ack over unary Acknowledge makes room for exactly that many more
        sub.acknowledge(subscription=subscription, ack_ids=[first[0].ack_id, first[1].ack_id])
        second = s.take(10, timeout=1.0)
        assert len(second) == 2, f"server sent {len(second)} after 2 acks"
        # an ack on the stream makes room too
        s.send(ack_ids=[first[2].ack_id] + [r.ack_id for r in second])
        third = s.take(10, timeout=1.0)
        assert len(third) == 3
        seen = [r.message.message_id for r in first + second + third]
        assert len(set(seen)) == 8 and set(seen) <= set(ids)
        assert s.error is None
    finally:
        s.close()


def test_stream_acks_and_nacks_on_the_stream(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "acks", ack_deadline_seconds=60)
    ids = raw_publish(pub, topic, [{"data": f"a{i}".encode()} for i in range(3)])
    s = RawStream(sub, {"subscription": subscription, "stream_ack_deadline_seconds": 60, "client_id": "raw-acks"})
    try:
        got = {r.message.message_id: r for r in s.take(3, timeout=5)}
        assert set(got) == set(ids)
        # ack two on the stream, then nack all three on the stream: only the unacked one comes back
        s.send(ack_ids=[got[ids[0]].ack_id, got[ids[1]].ack_id])
        s.send(modify_deadline_ack_ids=[got[i].ack_id for i in ids], modify_deadline_seconds=[0, 0, 0])
        again = s.take(3, timeout=1.0)
        assert [r.message.message_id for r in again] == [ids[2]]
        assert again[0].message.data == b"a2"
        # a modack on the stream extends the lease (the stream deadline is 60 s; shorten to 1 s)
        s.send(modify_deadline_ack_ids=[again[0].ack_id], modify_deadline_seconds=[1])
        back = s.take(1, timeout=5)
        assert [r.message.message_id for r in back] == [ids[2]]
        assert s.error is None
    finally:
        s.close()


def test_stream_with_bad_deadline_is_invalid(clients):
    pub, sub = clients
    _, subscription = _setup(pub, sub, "baddl")
    s = RawStream(sub, {"subscription": subscription, "stream_ack_deadline_seconds": 5})
    try:
        s.reader.join(timeout=10)
        assert isinstance(s.error, gexc.InvalidArgument), s.error
    finally:
        s.close()


def test_stream_on_missing_subscription_is_not_found(clients):
    _, sub = clients
    s = RawStream(sub, {"subscription": sub.subscription_path(P, "nope-sub"), "stream_ack_deadline_seconds": 10})
    try:
        s.reader.join(timeout=10)
        assert isinstance(s.error, gexc.NotFound), s.error
    finally:
        s.close()


def test_flow_control_set_again_after_the_first_request_ends_the_stream_invalid(clients):
    """Pub/Sub sets a stream's flow control by its first request only, and aborts a stream whose later request
    sets it; the limits it had before stand until then (the stream serves as asked)."""
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "reflow")
    raw_publish(pub, topic, [{"data": f"r{i}".encode()} for i in range(6)])
    s = RawStream(sub, {"subscription": subscription, "stream_ack_deadline_seconds": 60,
                        "max_outstanding_messages": 2, "client_id": "raw-reflow"})
    try:
        assert len(s.take(6, timeout=1.5)) == 2
        s.send(max_outstanding_messages=10)
        s.reader.join(timeout=10)
        assert isinstance(s.error, gexc.InvalidArgument), s.error
        assert "initial StreamingPullRequest" in str(s.error)
    finally:
        s.close()
