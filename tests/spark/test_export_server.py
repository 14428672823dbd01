"""Export subscriptions run by the node itself (`pigeon serve --export-root`, pigeon.node.exports): subscriptions
created through the official client with a `cloud_storage_config` and a `bigquery_config` become text files and a
Delta table under the root with no other command (the formats themselves: test_export_formats.py); the node killed
(-9) mid-export and started again, and the Spark driver's JVM killed (-9) mid-export, leave every message in the
files and the table exactly once; `state` says ACTIVE, and RESOURCE_ERROR for a bucket that cannot be made. The
node's Spark job is a child process of the real server (this session's SparkSession is not used)."""

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
TABLE = f"projects/{P}/subscriptions/clicks-table"
ROUND = 3000  # messages per round, published 1,000 a request to a topic of one shard
WAIT_S = 300.0  # for each step: Spark starts in ~10 s on an idle 2-core machine, in over a minute on a loaded one


def _text_lines(root: str) -> list[bytes]:
    out = []
    for f in glob.glob(os.path.join(root, "text-bucket", "clicks", "*.txt")):
        with open(f, "rb") as fh:
            out += fh.read().splitlines()
    return out


def _delta_ids(root: str) -> list[str]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        t = DeltaTable(os.path.join(root, "_bigquery", P, "analytics", "clicks")).to_pyarrow_table()
    except TableNotFoundError:
        return []
    return t.column("message_id").to_pylist()


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


def _jvm_of(pid: int) -> int:
    """The Spark driver's JVM: the job's child running java."""
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if ppid == pid and b"java" in f.read():
                    return int(d)
        except OSError:
            pass
    raise AssertionError(f"the export job {pid} has no JVM")


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
        sub.create_subscription(request={"name": TABLE, "topic": TOPIC, "bigquery_config": {
            "table": f"{P}.analytics.clicks", "write_metadata": True}})
        sub.create_subscription(request={"name": BLOCKED, "topic": TOPIC,
                                         "cloud_storage_config": {"bucket": "blocked-bucket"}})

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
        _wait("the blocked bucket's state", lambda: sub.get_subscription(subscription=BLOCKED).state ==
              types.Subscription.State.RESOURCE_ERROR, server)  # (probed within a tick)
        assert sub.get_subscription(subscription=BLOCKED).cloud_storage_config.state == \
            types.CloudStorageConfig.State.NOT_FOUND
        _wait("the first file", lambda: _files(root) > 0, server, every_s=0.02)
        groups.append(_job_pid(data))
        server.kill()  # kill -9 of the node mid-export: its Spark job ends with it
        assert groups[0] and _group_gone(groups[0]), "the export job outlived its node"
        server.start()
        _wait("round 1", lambda: len(_text_lines(root)) >= ROUND, server)
        _wait("round 1 in the Delta table", lambda: len(_delta_ids(root)) >= ROUND, server)

        sent.update(publish(ROUND))
        files = _files(root)
        _wait("a file of round 2", lambda: _files(root) > files, server, every_s=0.02)
        pid = _job_pid(data)
        groups.append(pid)
        os.kill(_jvm_of(pid), signal.SIGKILL)  # kill -9 of the Spark driver's JVM mid-export: the job ends, the
        #                                        node starts another

        _wait("the job started again", lambda: _job_pid(data) not in (0, pid), server)
        _wait("round 2", lambda: len(_text_lines(root)) >= 2 * ROUND, server)
        _wait("round 2 in the Delta table", lambda: len(_delta_ids(root)) >= 2 * ROUND, server)

        # the export's lag (what the console shows) down to nothing: every batch done and committed, replays too
        _wait("no lag", lambda: all(r.num_undelivered_messages == 0 for r in _subscription_stats(server.address)
                                    if r.name in (TEXT, TABLE)), server)
        lines = _text_lines(root)
        assert len(lines) == len(set(lines)) == 2 * ROUND  # every message once
        assert sorted(lines) == sorted(sent.values())
        assert sorted(_delta_ids(root)) == sorted(sent)  # and in the Delta table, once each
        got = sub.get_subscription(subscription=TEXT)
        assert got.state == types.Subscription.State.ACTIVE
        assert got.cloud_storage_config.state == types.CloudStorageConfig.State.ACTIVE
        table = sub.get_subscription(subscription=TABLE)
        assert (table.state, table.bigquery_config.state) == (types.Subscription.State.ACTIVE,
                                                              types.BigQueryConfig.State.ACTIVE)
        assert got.cloud_storage_config.max_messages == 1000  # (the configuration as created, beside the states)
        listed = {s.name: s.state for s in sub.list_subscriptions(project=f"projects/{P}")}
        assert listed[BLOCKED] == types.Subscription.State.RESOURCE_ERROR and listed[TEXT] == 1

        stats = {r.name: r for r in _subscription_stats(server.address)}  # what the console shows
        assert (stats[TEXT].export, stats[TEXT].export_state) == ("cloud storage: text-bucket", "ACTIVE")
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
