"""The `pigeon` data source on a cluster: read through any node, every shard's range is served by the node that
owns the topic (the others forward each pigeon.v1.Ranges call to it, as they forward the Pub/Sub API's), and the
rows are the same whichever node the query names; cursors are created, read and moved through any node too."""

from __future__ import annotations

import pytest

from spark_helpers import Node, sample_messages

pytestmark = [pytest.mark.spark, pytest.mark.e2e]


def test_a_read_through_any_node_gives_the_owners_rows(spark, three_nodes, etcd):
    from pigeon.testing.cluster import settled_owners, topic_owned_by

    topic = f"projects/proj/topics/{topic_owned_by(settled_owners(etcd.endpoint), 'n1', 'spark')}"
    cursor = "projects/proj/subscriptions/spark-cursor"
    nodes = {name: Node(p) for name, p in three_nodes.items()}
    try:
        nodes["n2"].create_topic(topic)
        created = nodes["n3"].client.create_cursor(cursor, topic)  # holds retention from offset 0
        assert created.created and list(created.offsets) == [0] * len(created.offsets)
        msgs = sample_messages(3000)
        ids = nodes["n2"].publish(topic, msgs)
        want = {i: (d, a, k) for i, (d, a, k) in zip(ids, msgs)}
        latest = None
        for name in ("n1", "n2", "n3"):  # the owner, then two nodes that forward to it
            lo = nodes[name].client.latest_offsets(topic)
            assert sum(s.latest - s.earliest for s in lo.shards) == len(msgs), name
            latest = latest or [s.latest for s in lo.shards]
            assert [s.latest for s in lo.shards] == latest
            df = spark.read.format("pigeon").option("endpoint", nodes[name].endpoint).option("topic", topic).load()
            rows = df.collect()
            assert len(rows) == len(msgs), name
            assert {r.message_id: (bytes(r.data), dict(r.attributes), r.ordering_key) for r in rows} == want, name
        moved = nodes["n2"].client.commit_cursor(cursor, latest)
        assert list(moved.offsets) == latest and moved.backlog == 0
        assert list(nodes["n3"].client.get_cursor(cursor).offsets) == latest
        assert list(nodes["n1"].client.get_cursor(cursor).offsets) == latest
    finally:
        for n in nodes.values():
            n.close()
