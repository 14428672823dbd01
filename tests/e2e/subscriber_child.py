"""A subscriber process for tests that kill it: streams `subscription` with the official client, prints each
message id it receives (one per line, flushed) and never acks. Usage: python subscriber_child.py ADDRESS SUB"""

import os
import sys
import threading

os.environ["PUBSUB_EMULATOR_HOST"] = sys.argv[1]

from google.cloud import pubsub_v1  # noqa: E402  (reads PUBSUB_EMULATOR_HOST)

_lock = threading.Lock()


def _hold(message) -> None:
    with _lock:
        print(message.message_id, flush=True)  # held, never acked: the test kills this process


subscriber = pubsub_v1.SubscriberClient()
future = subscriber.subscribe(sys.argv[2], _hold, flow_control=pubsub_v1.types.FlowControl(max_messages=1000))
future.result()
