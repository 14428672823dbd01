"""Hop timestamps (pigeon.node.hops): off, nothing is kept; on (PIGEON_HOPS names a file), one publish to a topic a
stream waits on leaves the engine's and the journal's hops in the order its message takes them, written out when
the process exits. Each case runs in a process of its own: the switch is read once, on import."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import asyncio, sys
from google.pubsub_v1 import types
from pigeon.node import hops
from pigeon.node.engine import Engine
from pigeon.ops.config import Config
from pigeon.testing.clock import SimClock

T, S = "projects/p/topics/hops", "projects/p/subscriptions/hops"

async def main():
    e = Engine(Config(data_dir=sys.argv[1], fsync="always", shards_per_topic=1), SimClock())
    await e.start()
    await e.create_topic(types.Topic.pb()(name=T))
    await e.create_subscription(types.Subscription.pb()(name=S, topic=T, ack_deadline_seconds=60))
    stream = e.delivery.open_stream(S, "c", 60, 10, 0)
    got = asyncio.create_task(e.delivery.stream_next(stream))
    await asyncio.sleep(0.05)
    raw = types.PublishRequest.pb()(topic=T, messages=[{"data": b"x"}]).SerializeToString()
    await e.publish(T, raw, 1, "")
    assert len(await got) == 1
    await e.stop()
    print("kept", len(hops._events))

asyncio.run(main())
"""


def _probe(tmp_path, hops_file: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PIGEON_HOPS"}
    if hops_file:
        env["PIGEON_HOPS"] = hops_file
    p = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "data")], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_off_no_hop_is_kept(tmp_path):
    assert "kept 0" in _probe(tmp_path, None)


def test_on_a_message_s_hops_are_written_in_its_order(tmp_path):
    path = tmp_path / "hops.txt"
    _probe(tmp_path, str(path))
    events = sorted((int(t), hop) for t, hop in (line.split() for line in path.read_text().splitlines()))
    order = [hop for _, hop in events]
    first = order.index("committed")  # the publish's (the setup's changes have no waiting stream to wake)
    path_of_message = ["committed", "asked", "taken", "syncing", "synced", "posted", "woken"]
    seen = [h for h in order[first:] if h in path_of_message]
    it = iter(seen)
    assert all(h in it for h in path_of_message), seen  # each hop, in this order (others may come between)
