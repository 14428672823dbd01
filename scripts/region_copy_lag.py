"""How far behind a cross-region copy runs (docs/regions.md, "Cross-region copies"): a topic labelled
`pigeon-copy-to: east` published to through the west at a steady rate (1 KiB messages, the official client, its
own batching) and consumed there (a StreamingPull subscriber acking), the links between the regions delayed
`--delay-ms` each way; the east's node is asked for its copy's figures every half second. Prints the lag (what the
west stored in the last this many seconds may not be in the east's copy yet), the age of the copied ack state,
and the copy's rate, as a table of percentiles.

    python scripts/region_copy_lag.py [--delay-ms 50] [--rate 1000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.testing.cluster import clients_of, stop_subscriber  # noqa: E402
from pigeon.testing.regions import Deployment  # noqa: E402

TOPIC, SUB = "projects/copy-lag/topics/copied", "projects/copy-lag/subscriptions/copied"


def figures(node) -> dict[str, float]:
    with urllib.request.urlopen(f"{node.http}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for name in ("lag_seconds", "lag_messages", "acks_age_seconds", "copied_messages_total"):
        m = re.search(rf'^pigeon_region_(?:copy_)?{name}{{region="west",topic="{re.escape(TOPIC)}"}} (\S+)$', text,
                      re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--rate", type=int, default=1000, help="messages a second, published through the west")
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pigeon-copy-lag-") as root:
        dep = Deployment(root, delay_s=args.delay_ms / 1000).start()
        try:
            pub, sub = clients_of(dep.node("west"))
            pub.create_topic(request={"name": TOPIC, "labels": {"pigeon-copy-to": "east"}})
            sub.create_subscription(name=SUB, topic=TOPIC, ack_deadline_seconds=30)
            stop, sent = threading.Event(), [0]

            def publish():
                body, tick = b"x" * 1024, 0.05
                while not stop.is_set():
                    t0 = time.monotonic()
                    futs = [pub.publish(TOPIC, body) for _ in range(int(args.rate * tick))]
                    for f in futs:
                        f.result(timeout=60)
                    sent[0] += len(futs)
                    time.sleep(max(0.0, tick - (time.monotonic() - t0)))

            thread = threading.Thread(target=publish, daemon=True)
            thread.start()
            consumer = sub.subscribe(SUB, lambda m: m.ack())
            time.sleep(3)  # (warm: the copy's first reads)
            samples, start, sent0 = [], figures(dep.node("east")), sent[0]
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.seconds:
                time.sleep(0.5)
                samples.append(figures(dep.node("east")))
                print(f"  {time.monotonic() - t0:5.1f} s: lag {samples[-1]['lag_seconds']:.2f} s, "
                      f"{samples[-1]['lag_messages']:.0f} behind, ack state {samples[-1]['acks_age_seconds']:.2f} s",
                      flush=True)
            took = time.monotonic() - t0
            published = (sent[0] - sent0) / took
            stop.set()
            thread.join(timeout=60)
            stop_subscriber(consumer)
        finally:
            dep.stop()
    copied = (samples[-1]["copied_messages_total"] - start["copied_messages_total"]) / took
    print(f"\nlinks between regions delayed {args.delay_ms:g} ms each way; 1 KiB messages published through the "
          f"west for {args.seconds:g} s at {published:,.0f} msg/s (asked: {args.rate}); the east copied "
          f"{copied:,.0f} msg/s")
    print("| figure | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|")
    for key, label in (("lag_seconds", "copy lag, s"), ("lag_messages", "messages behind"),
                       ("acks_age_seconds", "ack state age, s")):
        xs = [s[key] for s in samples]
        print(f"| {label} | {pct(xs, .5):.2f} | {pct(xs, .9):.2f} | {pct(xs, .99):.2f} | {max(xs):.2f} |")
    print(f"(mean lag {statistics.fmean(s['lag_seconds'] for s in samples):.2f} s over {len(samples)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
