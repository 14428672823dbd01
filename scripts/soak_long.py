"""A long soak of a cluster: etcd and three `pigeon serve --etcd` nodes on loopback under steady mixed load — the
official client publishing to a few topics (one with ordering keys), StreamingPull subscribers acking most
messages, nacking some, a dead-letter topic catching poison messages, a seek now and then (on a subscription of its own) — with one node
restarted (SIGTERM, then started on its data) every `--restart-every` minutes. Every minute it records each
node's RSS, open file descriptors and threads, etcd's keys under /pigeon, the ledgers listed, the disk used and
the publish latency (p50/p99 of the minute), and at the end it checks:

  * nothing acknowledged lost: every publish the client was told succeeded is delivered (or dead-lettered);
  * flat after warm-up: RSS, fds, etcd keys, ledgers and the nodes' disk use grow by at most 10 % from the first
    to the second half (averages of each half after the warm-up; etcd's own disk is recorded beside);
  * p99 steady: the second half's median p99 at most twice the first half's.

    python scripts/soak_long.py --hours 2                # make soak-long HOURS=2
    python scripts/soak_long.py --hours 0.1 --minute-s 10 --restart-every 3   # a short try (10 s samples)

A table (Markdown) and, with matplotlib installed, a chart go to bench/results/. Loopback only; it stops by
itself after `--hours` (plus the drain), and ends only the processes it started."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from pigeon.testing.cluster import await_status, node_process, status, wipe  # noqa: E402
from pigeon.testing.etcd import EtcdProcess  # noqa: E402

P = "projects/soak"
IDS = ("n1", "n2", "n3")
GROWTH_MAX = 0.10
RESULTS = os.path.join(os.path.dirname(__file__), "..", "bench", "results")


class Load:
    """Publishers (a thread per topic, a message every few ms, each waited for) and a subscriber per topic."""

    def __init__(self, pub, sub, topics: list[str], dlq: str):
        self.pub, self.sub, self.topics = pub, sub, topics
        self.lock = threading.Lock()
        self.published: dict[str, str] = {}  # token (topic number · sequence, an attribute) → topic
        self.received: set[str] = set()
        self.dead: set[str] = set()
        self.failed: list[str] = []
        self.latencies: list[float] = []  # publish round trips of the current minute
        self.nacked = 0
        self._stop = threading.Event()
        self.streams = []
        for t in topics:
            name = t.replace("/topics/", "/subscriptions/")
            self.streams.append(sub.subscribe(name, self._on_message))
        self.streams.append(sub.subscribe(dlq.replace("/topics/", "/subscriptions/"), self._on_dead))
        # the seeks go to a subscription of their own: a seek to a time acks what was published before it, delivered
        # or not (a subscriber held up by a restart would lose what it had not received yet: that is the seek's rule)
        self.streams.append(sub.subscribe(topics[1].replace("/topics/", "/subscriptions/") + "-replay",
                                          lambda m: m.ack()))
        self.threads = [threading.Thread(target=self._publish, args=(t, i), daemon=True) for i, t in enumerate(topics)]
        for th in self.threads:
            th.start()

    def _on_message(self, m) -> None:
        if m.attributes.get("poison"):
            m.nack()  # until its delivery attempts run out: then the dead-letter topic has it
            return
        if hash(m.message_id) % 50 == 0 and m.delivery_attempt in (None, 0, 1):
            with self.lock:
                self.nacked += 1
            m.nack()  # some come back once
            return
        with self.lock:
            self.received.add(m.attributes["token"])
        m.ack()

    def _on_dead(self, m) -> None:
        with self.lock:
            self.dead.add(m.attributes["token"])
        m.ack()

    def _publish(self, topic: str, no: int) -> None:
        i = 0
        while not self._stop.is_set():
            attrs = {"token": f"{no}.{i}", **({"poison": "1"} if i % 500 == 499 else {})}
            key = f"k{i % 8}" if no == 0 else ""
            t0 = time.monotonic()
            try:
                self.pub.publish(topic, os.urandom(512), ordering_key=key, **attrs).result(timeout=120)
                with self.lock:
                    self.published[attrs["token"]] = "poison" if "poison" in attrs else topic
                    self.latencies.append(time.monotonic() - t0)
            except Exception as e:  # noqa: BLE001 — what the application would see
                if key:
                    self.pub.resume_publish(topic, key)
                with self.lock:
                    self.failed.append(repr(e)[:200])
            i += 1
            time.sleep(0.004)

    def minute(self) -> tuple[float, float, int]:
        """(p50, p99 in ms, publishes) of the publishes since the last call."""
        with self.lock:
            lat, self.latencies = sorted(self.latencies), []
        if not lat:
            return 0.0, 0.0, 0
        return lat[len(lat) // 2] * 1e3, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, len(lat)

    def missing(self) -> list[str]:
        """Acknowledged publishes neither received nor dead-lettered (a message redelivered past its attempts —
        by seeks, restarts — goes to the dead-letter topic, which is not a loss)."""
        with self.lock:
            return [m for m in self.published if m not in self.received and m not in self.dead]

    def stop_publishing(self) -> None:
        self._stop.set()
        for th in self.threads:
            th.join(timeout=150)

    def stop(self) -> None:
        self.stop_publishing()
        for s in self.streams:
            s.cancel()


def _proc_stats(pid: int) -> tuple[int, int, int]:
    """(RSS bytes, open fds, threads) of a process."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def _etcd_keys(endpoint: str) -> int:
    import asyncio

    from pigeon.node.meta_etcd import EtcdMetadata

    async def go():
        meta = EtcdMetadata(endpoint)
        try:
            return len(await meta.list("/pigeon/"))
        finally:
            await meta.close()
    return asyncio.run(go())


def _du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _growth(rows: list[dict], key: str, warm: int) -> float:
    """Growth of `key`'s average from the first half to the second half of the rows after `warm`."""
    after = [r[key] for r in rows[warm:]]
    if len(after) < 4:
        return 0.0
    half = len(after) // 2
    first, second = statistics.mean(after[:half]), statistics.mean(after[half:])
    return (second - first) / first if first else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--restart-every", type=float, default=10.0, help="minutes between node restarts")
    ap.add_argument("--warm", type=float, default=0.2, help="share of the run that is warm-up (not judged)")
    ap.add_argument("--topics", type=int, default=3)
    ap.add_argument("--minute-s", type=float, default=60.0, help="seconds between samples (a short try: fewer)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="pigeon-soak-")
    etcd = EtcdProcess(os.path.join(root, "etcd")).start()
    nodes = {}
    load = None
    rows: list[dict] = []
    started = datetime.now(timezone.utc)
    try:
        wipe(etcd.endpoint)
        nodes = {n: node_process(root, etcd.endpoint, n).start() for n in IDS}
        await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == 3
                     and all(r["bundles"] for r in st["nodes"]), timeout=60)
        os.environ["PUBSUB_EMULATOR_HOST"] = "ipv4:" + ",".join(nodes[n].address for n in IDS)
        from google.cloud import pubsub_v1
        from google.pubsub_v1 import types

        pub = pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(
            enable_message_ordering=True))
        sub = pubsub_v1.SubscriberClient()
        topics = [f"{P}/topics/soak{i}" for i in range(args.topics)]
        dlq = f"{P}/topics/dead"
        for t in topics + [dlq]:
            pub.create_topic(name=t)
        sub.create_subscription(name=dlq.replace("/topics/", "/subscriptions/"), topic=dlq)
        sub.create_subscription(name=topics[1].replace("/topics/", "/subscriptions/") + "-replay", topic=topics[1])
        for i, t in enumerate(topics):
            sub.create_subscription(request={
                "name": t.replace("/topics/", "/subscriptions/"), "topic": t, "enable_message_ordering": i == 0,
                "dead_letter_policy": types.DeadLetterPolicy(dead_letter_topic=dlq, max_delivery_attempts=5)})
        load = Load(pub, sub, topics, dlq)
        end = time.monotonic() + args.hours * 3600
        next_restart = time.monotonic() + args.restart_every * args.minute_s
        next_seek = time.monotonic() + 5 * args.minute_s
        restarts = 0
        minute, t_start = 0, time.monotonic()
        while time.monotonic() < end:
            minute += 1
            time.sleep(max(0.0, t_start + minute * args.minute_s - time.monotonic()))
            p50, p99, n = load.minute()
            st = status(etcd.endpoint)
            row = {"minute": minute, "publishes": n, "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
                   "etcd_keys": _etcd_keys(etcd.endpoint), "ledgers": st["ledgers"]["total"],
                   "disk_mb": round(sum(_du(os.path.join(root, n)) for n in IDS) / 1e6, 1),
                   "etcd_mb": round(_du(etcd.data_dir) / 1e6, 1), "failed": len(load.failed), "restarts": restarts}
            rss = fds = threads = 0
            for name, d in nodes.items():
                r, f, t = _proc_stats(d.proc.pid)
                rss, fds, threads = rss + r, fds + f, threads + t
                row[f"rss_{name}_mb"] = round(r / 1e6, 1)  # (one process life at a time: a restart starts anew)
            row.update(rss_mb=round(rss / 1e6, 1), fds=fds, threads=threads)
            rows.append(row)
            print(json.dumps(row), flush=True)
            now = time.monotonic()
            if now >= next_restart and now < end - 2 * args.minute_s:
                name = IDS[restarts % len(IDS)]
                nodes[name].stop()
                nodes[name] = node_process(root, etcd.endpoint, name, port=nodes[name].port).start()
                restarts += 1
                next_restart = now + args.restart_every * args.minute_s
            if now >= next_seek:  # a subscriber rewinds a little (a seek to a time): deliveries come again
                sub.seek(request={"subscription": topics[1].replace("/topics/", "/subscriptions/") + "-replay",
                                  "time": datetime.fromtimestamp(time.time() - 5, timezone.utc)})
                next_seek = now + 5 * args.minute_s
        load.stop_publishing()
        deadline = time.monotonic() + 120
        while load.missing() and time.monotonic() < deadline:
            time.sleep(1)
        missing = load.missing()
        load.stop()
        warm = int(len(rows) * args.warm)
        growth = {k: _growth(rows, k, warm) for k in ("rss_mb", "fds", "etcd_keys", "ledgers", "disk_mb")}
        p99s = [r["p99_ms"] for r in rows[warm:] if r["publishes"]]
        half = len(p99s) // 2
        p99_ratio = statistics.median(p99s[half:]) / statistics.median(p99s[:half]) if half else 1.0
        verdict = []
        if missing:
            verdict.append(f"{len(missing)} acknowledged publishes never delivered (e.g. {missing[:5]})")
        verdict += [f"{k} grew {g:.0%}" for k, g in growth.items() if g > GROWTH_MAX]
        if p99_ratio > 2:
            verdict.append(f"p99 rose {p99_ratio:.1f}x")
        _write(rows, args, started, growth, p99_ratio, missing, load, restarts, verdict)
        print("soak: " + ("; ".join(verdict) if verdict else "clean") +
              f" ({len(load.published):,} published, {load.nacked:,} nacked, {len(load.dead):,} dead-lettered, "
              f"{restarts} restarts, {len(load.failed)} failed calls)")
        return 1 if verdict else 0
    finally:
        if load is not None:
            load.stop()
        for d in nodes.values():
            d.kill()
        etcd.kill()


def _write(rows, args, started, growth, p99_ratio, missing, load, restarts, verdict) -> None:
    stem = os.path.join(RESULTS, started.strftime("%Y-%m-%dT%H%M") + "-soak")
    cols = ["minute", "publishes", "p50_ms", "p99_ms", "rss_mb", *(f"rss_{n}_mb" for n in IDS), "fds", "threads",
            "etcd_keys", "ledgers", "disk_mb", "etcd_mb", "restarts", "failed"]
    lines = [f"# Soak: a 3-node cluster for {args.hours:g} h ({started:%Y-%m-%d %H:%M} UTC)", "",
             f"    python scripts/soak_long.py --hours {args.hours:g} --restart-every {args.restart_every:g}", "",
             f"Verdict: {'; '.join(verdict) if verdict else 'clean'}. {len(load.published):,} publishes acknowledged, "
             f"{len(missing)} of them never delivered; {load.nacked:,} nacked once, {len(load.dead):,} poison messages "
             f"dead-lettered; {restarts} node restarts; {len(load.failed)} client calls failed. Growth from the first "
             f"to the second half after warm-up: " + ", ".join(f"{k} {g:+.1%}" for k, g in growth.items()) +
             f"; p99 second half ÷ first half {p99_ratio:.2f}.", "",
             "| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(2, 3, figsize=(13, 6))
    for ax, key in zip(axes.flat, ("rss_mb", "fds", "disk_mb", "etcd_keys", "ledgers", "p99_ms")):
        ax.plot([r["minute"] for r in rows], [r[key] for r in rows])
        ax.set_title(key)
        ax.set_xlabel("minute")
    fig.tight_layout()
    fig.savefig(stem + ".png")


if __name__ == "__main__":
    sys.exit(main())
