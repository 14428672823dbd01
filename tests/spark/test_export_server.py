"""Export subscriptions run by the node itself (`pigeon serve --export-root`, pigeon.node.exports): a subscription
created through the official client with a `cloud_storage_config` becomes text files under the root with no other
command (the formats themselves: test_export_formats.py); the node killed (-9) mid-export and started again, and the Spark job killed (-9) mid-export, leave
every message in the files exactly once; `state` says ACTIVE, and RESOURCE_ERROR for a bucket that cannot be made.
The node's Spark job is a child process of the real server (this session's SparkSession is not used)."""

from __future__ import annotations

import glob
import json
import os
import signal
import time

import grpc
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1 import types
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisher

from pigeon.api.proto import pigeon_monitoring_pb2 as mon

# (three Spark starts: ~10 s each on an idle 2-core machine, minutes on a loaded one)
pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.timeout(900)]
P = "export-proj"
TOPIC = f"projects/{P}/topics/clicks"
TEXT = f"projects/{P}/subscriptions/clicks-text"
BLOCKED = f"projects/{P}/subscriptions/clicks-blocked"
ROUND = 5000  # messages per round, published 1,000 a request to a topic of one shard
WAIT_S = 300.0  # for each step: Spark starts in ~10 s on an idle 2-core machine, in over a minute on a loaded one


def _text_lines(root: str) -> list[bytes]:
    out = []
    for f in glob.glob(os.path.join(root, "text-bucket", "clicks", "*.txt")):
        with open(f, "rb") as fh:
            out += fh.read().splitlines()
    return out


def _files(root: str) -> int:
    return len(glob.glob(os.path.join(root, "text-bucket", "clicks", "*.txt")))


def _wait(what: str, done, server, every_s: float = 0.2) -> None:
    start = time.monotonic()
    deadline = start + WAIT_S
    while not done():
        assert server.proc.poll() is None, server.log()
        assert time.monotonic() < deadline, f"{what}: not within the deadline\n{server.log()}"
        time.sleep(every_s)
    print(f"{what}: {time.monotonic() - start:.1f} s")


def _job_pid(data_dir: str) -> int:
    try:
        with open(os.path.join(data_dir, "exports", "status.json")) as f:
            return json.load(f)["pid"]
    except (OSError, ValueError, KeyError):
        return 0


def _subscription_stats(address: str) -> list:
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary("/pigeon.v1.Monitoring/ListSubscriptionStats",
                              request_serializer=lambda r: r.SerializeToString(),
                              response_deserializer=mon.ListSubscriptionStatsResponse.FromString)
        return list(call(mon.ListStatsRequest(project=f"projects/{P}"), timeout=30).subscriptions)


def _group_gone(pgid: int, within_s: float = 20.0) -> bool:
    """Whether every process of the job's group (the job, its JVM, Spark's Python workers) ended."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_the_node_runs_export_subscriptions_exactly_once_through_kills(server_factory, tmp_path, monkeypatch):
    root, data = str(tmp_path / "export"), str(tmp_path / "node")
    os.makedirs(root)
    with open(os.path.join(root, "blocked-bucket"), "w") as f:  # a file where the bucket's directory would be
        f.write("not a directory")
    server = server_factory(data_dir=data, extra=["--export-root", root, "--export-master", "local[2]",
                                                  "--shards-per-topic", "1"])
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
    pub = pubsub_v1.PublisherClient()
    sub = pubsub_v1.SubscriberClient()
    groups: list[int] = []
    try:
        pub.create_topic(name=TOPIC)
        sub.create_subscription(request={"name": TEXT, "topic": TOPIC, "cloud_storage_config": {
            "bucket": "text-bucket", "filename_prefix": "clicks/", "filename_suffix": ".txt", "text_config": {},
            "max_messages": 1000}})
        sub.create_subscription(request={"name": BLOCKED, "topic": TOPIC,
                                         "cloud_storage_config": {"bucket": "blocked-bucket"}})
        _wait("the blocked bucket's state", lambda: sub.get_subscription(subscription=BLOCKED).state ==
              types.Subscription.State.RESOURCE_ERROR, server)  # (probed within a tick)
        assert sub.get_subscription(subscription=BLOCKED).cloud_storage_config.state == \
            types.CloudStorageConfig.State.NOT_FOUND

        def publish(first: int) -> dict[str, bytes]:
            """ROUND messages, 1,000 per Publish (the client's generated layer: no client-side batching), so what
            waits is always whole files — a remainder would wait for max_duration, 5 minutes."""
            out = {}
            for start in range(first, first + ROUND, 1000):
                msgs = [types.PubsubMessage(data=b"click-%d" % i, attributes={"n": str(i)})
                        for i in range(start, start + 1000)]
                ids = GapicPublisher.publish(pub, request={"topic": TOPIC, "messages": msgs}, timeout=60).message_ids
                out.update(zip(ids, (m.data for m in msgs)))
            return out

        sent = publish(0)
        assert len(set(sent.values())) == ROUND
        _wait("the first file", lambda: _files(root) > 0, server, every_s=0.02)
        groups.append(_job_pid(data))
        server.kill()  # kill -9 of the node mid-export: its Spark job ends with it
        assert groups[0] and _group_gone(groups[0]), "the export job outlived its node"
        server.start()
        _wait("round 1", lambda: len(_text_lines(root)) >= ROUND, server)

        sent.update(publish(ROUND))
        files = _files(root)
        _wait("a file of round 2", lambda: _files(root) > files, server, every_s=0.02)
        pid = _job_pid(data)
        os.kill(pid, signal.SIGKILL)  # kill -9 of the Spark driver mid-export: the node starts it again
        groups.append(pid)
        _wait("the job started again", lambda: _job_pid(data) not in (0, pid), server)
        _wait("round 2", lambda: len(_text_lines(root)) >= 2 * ROUND, server)

        time.sleep(3)  # (a duplicate would come with a replayed batch: give one the time to land)
        lines = _text_lines(root)
        assert len(lines) == len(set(lines)) == 2 * ROUND  # every message once
        assert sorted(lines) == sorted(sent.values())
        got = sub.get_subscription(subscription=TEXT)
        assert got.state == types.Subscription.State.ACTIVE
        assert got.cloud_storage_config.state == types.CloudStorageConfig.State.ACTIVE
        assert got.cloud_storage_config.max_messages == 1000  # (the configuration as created, beside the states)
        listed = {s.name: s.state for s in sub.list_subscriptions(project=f"projects/{P}")}
        assert listed[BLOCKED] == types.Subscription.State.RESOURCE_ERROR and listed[TEXT] == 1

        stats = {r.name: r for r in _subscription_stats(server.address)}  # what the console shows
        assert (stats[TEXT].export, stats[TEXT].export_state) == ("cloud storage: text-bucket", "ACTIVE")
        assert stats[TEXT].num_undelivered_messages == 0  # the export's lag: none left
        assert stats[BLOCKED].export_state.startswith("RESOURCE_ERROR: ")
        assert stats[BLOCKED].num_undelivered_messages == 2 * ROUND  # kept for when it can run

        groups.append(_job_pid(data))
        assert server.stop() == 0  # a graceful stop stops the job too
        assert _group_gone(groups[-1]), "the export job outlived its node's stop"
    finally:
        sub.close()
        pub.stop()
        server.kill()
        for g in groups:  # (what a failed assertion left)
            try:
                os.killpg(g, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
