"""The gcloud CLI against a real server's REST port, as the README shows it
(CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB, credentials off): topics, subscriptions, snapshots and schemas
created, listed, described, updated and deleted; publish with attributes and an ordering key; pull --auto-ack;
seek. Skipped where the gcloud CLI is not installed."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("gcloud") is None, reason="the gcloud CLI is not "
                                                                                        "installed")]


@pytest.fixture
def gcloud(server_factory, tmp_path):
    srv = server_factory(http=True)
    env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": srv.http + "/", "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
           "CLOUDSDK_CORE_PROJECT": "demo", "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
           "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "PATH": "/usr/bin:/bin:/usr/local/bin"}

    def run(*args: str, ok: bool = True):
        out = subprocess.run(["gcloud", "pubsub", *args, "--format", "json"], env=env, capture_output=True,
                             text=True, timeout=120)
        if ok:
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout or "null")
        assert out.returncode != 0
        return out.stderr

    return run


def test_gcloud_pubsub_works_against_pigeon(gcloud):
    gcloud("topics", "create", "orders")
    assert [t["name"] for t in gcloud("topics", "list")] == ["projects/demo/topics/orders"]
    gcloud("topics", "update", "orders", "--update-labels", "team=x")
    assert gcloud("topics", "describe", "orders")["labels"] == {"team": "x"}

    gcloud("subscriptions", "create", "orders-sub", "--topic", "orders", "--ack-deadline", "20",
           "--enable-message-ordering", "--retain-acked-messages")
    sub = gcloud("subscriptions", "describe", "orders-sub")
    assert sub["ackDeadlineSeconds"] == 20 and sub["topic"] == "projects/demo/topics/orders"
    gcloud("subscriptions", "update", "orders-sub", "--ack-deadline", "30")
    assert gcloud("subscriptions", "describe", "orders-sub")["ackDeadlineSeconds"] == 30

    ids = gcloud("topics", "publish", "orders", "--message", "hello", "--attribute", "a=1,b=2",
                 "--ordering-key", "k1")["messageIds"]
    got = gcloud("subscriptions", "pull", "orders-sub", "--auto-ack", "--limit", "5")
    assert [(m["message"]["messageId"], m["message"]["attributes"], m["message"]["orderingKey"]) for m in got] == \
        [(ids[0], {"a": "1", "b": "2"}, "k1")]
    assert gcloud("subscriptions", "pull", "orders-sub", "--auto-ack") == [], "acked: not delivered again"

    gcloud("subscriptions", "seek", "orders-sub", "--time", "2000-01-01T00:00:00Z")
    again = gcloud("subscriptions", "pull", "orders-sub", "--auto-ack", "--limit", "5")
    assert [m["message"]["messageId"] for m in again] == ids, "seek to a time before it: delivered again"

    gcloud("snapshots", "create", "snap-1", "--subscription", "orders-sub")
    assert [s["name"] for s in gcloud("snapshots", "list")] == ["projects/demo/snapshots/snap-1"]
    gcloud("subscriptions", "seek", "orders-sub", "--snapshot", "snap-1")
    gcloud("snapshots", "delete", "snap-1")

    definition = '{"type":"record","name":"R","fields":[{"name":"n","type":"int"}]}'
    gcloud("schemas", "create", "rec-schema", "--type", "AVRO", "--definition", definition)
    assert [s["name"] for s in gcloud("schemas", "list")] == ["projects/demo/schemas/rec-schema"]
    assert "INVALID_ARGUMENT" in gcloud("schemas", "create", "s1", "--type", "AVRO", "--definition", definition,
                                        ok=False)
    gcloud("schemas", "delete", "rec-schema")

    assert "NOT_FOUND" in gcloud("topics", "describe", "missing", ok=False)
    gcloud("subscriptions", "delete", "orders-sub")
    gcloud("topics", "delete", "orders")
    assert gcloud("topics", "list") == []


def test_gcloud_creates_a_cloud_storage_subscription(gcloud):
    """gcloud's --cloud-storage-* flags reach the subscription as Pub/Sub has them; on a node without --export-root
    it says RESOURCE_ERROR (nothing runs it: tests/spark/test_export_server.py runs one); a file name that would leave its
    bucket is refused."""
    gcloud("topics", "create", "clicks")
    gcloud("subscriptions", "create", "to-files", "--topic", "clicks", "--cloud-storage-bucket", "click-bucket",
           "--cloud-storage-file-prefix", "raw/", "--cloud-storage-max-duration", "1m", "--cloud-storage-output-format",
           "avro", "--cloud-storage-write-metadata", "--cloud-storage-max-messages", "1000")
    got = gcloud("subscriptions", "describe", "to-files")
    assert got["cloudStorageConfig"] == {"bucket": "click-bucket", "filenamePrefix": "raw/", "maxDuration": "60s",
                                         "maxMessages": "1000", "avroConfig": {"writeMetadata": True},
                                         "state": "NOT_FOUND"}
    assert got["state"] == "RESOURCE_ERROR"
    assert "filename_prefix" in gcloud("subscriptions", "create", "out", "--topic", "clicks", "--cloud-storage-bucket",
                                       "click-bucket", "--cloud-storage-file-prefix", "../up", ok=False)
