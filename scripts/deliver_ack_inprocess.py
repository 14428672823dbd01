"""The server's own cost of delivering and acking, without gRPC: an Engine in this process (fsync=never, one
shard), a backlog of N × 1 KiB messages, then one stream takes messages (`stream_next`) and acks them
(`stream_acks`) until the backlog is drained. Only the server calls are timed (the client's parsing of the
responses is not), so the figure is messages per second of server CPU for delivery + ack — the part Pigeon's
own code can make faster; what gRPC adds is in `pigeon bench`'s consume figure.

    python scripts/deliver_ack_inprocess.py --batches 400 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

from google.pubsub_v1 import types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.node.engine import Engine  # noqa: E402
from pigeon.ops.config import Config  # noqa: E402
from pigeon.testing.clock import SimClock  # noqa: E402

T, S = "projects/p/topics/inproc", "projects/p/subscriptions/inproc"
_Topic, _Sub, _Req, _Msg, _Resp = (getattr(types, n).pb() for n in
                                   ("Topic", "Subscription", "PublishRequest", "PubsubMessage", "StreamingPullResponse"))


async def one_round(batches: int, outstanding: int) -> float:
    e = Engine(Config(data_dir=tempfile.mkdtemp(prefix="pigeon-inproc-"), fsync="never", shards_per_topic=1),
               SimClock())
    await e.start()
    try:
        await e.create_topic(_Topic(name=T))
        await e.create_subscription(_Sub(name=S, topic=T, ack_deadline_seconds=60))
        raw = _Req(topic=T, messages=[_Msg(data=os.urandom(1024)) for _ in range(1000)]).SerializeToString()
        for _ in range(batches):
            await e.publish(T, raw, 1000, "")
        stream = e.open_stream(S, "inproc", 60, outstanding, 0)
        total, server_s = 0, 0.0
        while total < batches * 1000:
            t0 = time.perf_counter()
            out = await e.stream_next(stream)
            server_s += time.perf_counter() - t0
            ids = [m.ack_id for m in _Resp.FromString(b"".join(out)).received_messages]
            t0 = time.perf_counter()
            e.stream_acks(stream, ids)
            server_s += time.perf_counter() - t0
            total += len(ids)
        return total / server_s
    finally:
        await e.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=400, help="publish requests of 1,000 × 1 KiB")
    ap.add_argument("--outstanding", type=int, default=5000, help="the stream's flow control")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for i in range(args.rounds):
        rate = asyncio.run(one_round(args.batches, args.outstanding))
        print(f"round {i + 1}: server-side deliver+ack {rate:,.0f} msg/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
