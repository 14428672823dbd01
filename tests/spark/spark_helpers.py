"""Helpers for the Spark tests: the session builder, a raw-publishing client, sample messages."""

from __future__ import annotations

import os
import sys

from google.pubsub_v1 import types

from pigeon.spark.client import PigeonClient

Topic = types.Topic.pb()
Subscription = types.Subscription.pb()
PublishRequest = types.PublishRequest.pb()
PubsubMessage = types.PubsubMessage.pb()


def spark_env() -> None:
    """Executors run this interpreter; Spark binds and talks on loopback only; a Python worker has as long to
    connect back as a node's export job gives it (the suite runs in two processes on two cores: Spark's 15 s
    were once not enough for a worker's start, "Python worker failed to connect back")."""
    from pigeon.spark.export_jobs import socket_timeout_s

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", str(socket_timeout_s))  # (the Python side of the same)


def build_session(master: str = "local[2]", warehouse: str | None = None):
    from pigeon.spark.export_jobs import socket_timeout_s

    spark_env()
    from pyspark.sql import SparkSession

    b = (
        SparkSession.builder.master(master)
        .appName("pigeon-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.authenticate.socketTimeout", f"{socket_timeout_s}s")
    )
    if warehouse:
        b = b.config("spark.sql.warehouse.dir", warehouse)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    import pigeon.spark

    pigeon.spark.register(spark)
    return spark


class Node:
    """A started server plus a raw client (no client-side batching) for setting up tests."""

    def __init__(self, server):
        self.server = server
        self.endpoint = server.address
        self.client = PigeonClient(server.address)
        import grpc

        self._channel = grpc.insecure_channel(server.address)

    def _unary(self, path, req, resp_cls):
        call = self._channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=resp_cls.FromString)
        return call(req, timeout=30)

    def create_topic(self, name: str):
        return self._unary("/google.pubsub.v1.Publisher/CreateTopic", Topic(name=name), Topic)

    def create_subscription(self, sub):
        return self._unary("/google.pubsub.v1.Subscriber/CreateSubscription", sub, Subscription)

    def publish(self, topic: str, messages: list) -> list[str]:
        """messages: (data, attributes, ordering_key). One request per ordering key (≤ 1000 messages each),
        each key's messages in order; returns the ids in the order of `messages`."""
        by_key: dict[str, list[int]] = {}
        for i, (_, _, k) in enumerate(messages):
            by_key.setdefault(k, []).append(i)
        ids: list[str] = [""] * len(messages)
        for key, idx in by_key.items():
            for j in range(0, len(idx), 1000):
                part = idx[j : j + 1000]
                req = PublishRequest(topic=topic, messages=[
                    PubsubMessage(data=messages[i][0], attributes=messages[i][1], ordering_key=key) for i in part])
                for i, mid in zip(part, self.client.publish(req)):
                    ids[i] = mid
        return ids

    def close(self):
        self.client.close()
        self._channel.close()


def sample_messages(n: int, keys: int = 3, seed: int = 0) -> list[tuple[bytes, dict, str]]:
    """A mix: runs of keyed messages (some with attributes) and keyless ones."""
    import random

    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.random()
        if kind < 0.5:
            out.append((b"plain-%d" % i, {}, ""))
        elif kind < 0.8:
            out.append((b"keyed-%d" % i, {}, f"key-{rnd.randrange(keys)}"))
        else:
            out.append((b"attr-%d" % i + b"\x00\xff" * rnd.randrange(3), {"i": str(i), "k": "v"}, ""))
    return out
