"""The `pigeon` data source against a real node serving TLS and bearer tokens: a write and a read with the CA and a
token as options (the rows go through executors, which get the access from the driver), a read with a wrong
token failing with the node's UNAUTHENTICATED, and an export subscription of that node run with the access."""

from __future__ import annotations

import glob
import os

import grpc
import pytest
from google.pubsub_v1 import types

from pigeon.spark import options as opt
from pigeon.spark.client import PigeonClient
from tests.e2e.security_kit import Kit, call

pytestmark = [pytest.mark.spark, pytest.mark.e2e]
T = "projects/sec-spark/topics/orders"
CUR = "projects/sec-spark/subscriptions/orders-cursor"


def test_a_secured_node_is_written_and_read_with_a_ca_and_a_token(spark, server_factory, tmp_path):
    kit = Kit(str(tmp_path / "pki"))
    srv = server_factory(extra=kit.serve_args())
    endpoint = srv.address.replace("127.0.0.1", "localhost")  # the name the server's certificate carries
    assert call(kit.channel(srv.address), "/google.pubsub.v1.Publisher/CreateTopic",
                types.Topic.pb()(name=T).SerializeToString(), kit.admin_token)[0] == grpc.StatusCode.OK
    (tmp_path / "token").write_text(kit.admin_token)
    access = {"endpoint": endpoint, "topic": T, "tlsCa": kit.ca_path}
    client = PigeonClient(endpoint, opt.client_auth({**access, "token": kit.admin_token}))
    client.create_cursor(CUR, T)  # holds retention from offset 0
    client.close()

    rows = [(f"order-{i}".encode(),) for i in range(50)]
    (spark.createDataFrame(rows, "data binary").write.format("pigeon").options(**access)
     .option("token", kit.admin_token).option("sinkId", "secured-1").mode("append").save())
    got = spark.read.format("pigeon").options(**access).option("tokenFile", str(tmp_path / "token")).load()
    assert sorted(bytes(r.data) for r in got.select("data").collect()) == sorted(d for (d,) in rows)

    with pytest.raises(Exception, match="UNAUTHENTICATED"):
        spark.read.format("pigeon").options(**access).option("token", "not-a-token").load().collect()


def test_export_subscriptions_of_a_secured_node(spark, server_factory, tmp_path):
    import pyarrow.parquet as pq

    from pigeon.spark import export

    kit = Kit(str(tmp_path / "pki"))
    srv = server_factory(extra=kit.serve_args())
    ch = kit.channel(srv.address)
    topic, sub = "projects/sec-export/topics/clicks", types.Subscription.pb()(
        name="projects/sec-export/subscriptions/clicks-to-files", topic="projects/sec-export/topics/clicks")
    sub.cloud_storage_config.bucket = "secured-bucket"
    assert call(ch, "/google.pubsub.v1.Publisher/CreateTopic", types.Topic.pb()(name=topic).SerializeToString(),
                kit.admin_token)[0] == grpc.StatusCode.OK
    assert call(ch, "/google.pubsub.v1.Subscriber/CreateSubscription", sub.SerializeToString(),
                kit.admin_token)[0] == grpc.StatusCode.OK
    publish = types.PublishRequest.pb()(topic=topic, messages=[{"data": b"click-%d" % i} for i in range(20)])
    assert call(ch, "/google.pubsub.v1.Publisher/Publish", publish.SerializeToString(), kit.admin_token)[0] == \
        grpc.StatusCode.OK
    root = str(tmp_path / "export")
    endpoint = srv.address.replace("127.0.0.1", "localhost")
    access = opt.access_options(ca_file=kit.ca_path, token=kit.admin_token)
    assert export.run(endpoint, ["sec-export"], root, once=True, spark=spark, access=access) == 1
    files = glob.glob(os.path.join(root, "secured-bucket", "**", "*"), recursive=True)
    data = [d for f in files if os.path.isfile(f) for d in pq.read_table(f).column("data").to_pylist()]
    assert sorted(data) == sorted(b"click-%d" % i for i in range(20))
    with pytest.raises(Exception, match="UNAUTHENTICATED"):  # the job's own calls carry the access too
        export.run(endpoint, ["sec-export"], root, once=True, spark=spark,
                   access=opt.access_options(ca_file=kit.ca_path, token="not-a-token"))
