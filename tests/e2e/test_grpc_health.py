"""`grpc.health.v1` and server reflection on a real node's gRPC port, asked as grpc_health_probe and grpcurl ask:
a ready node is SERVING for "" and the Pub/Sub services, and goes NOT_SERVING the moment SIGTERM starts its stop;
a cluster node drained with `pigeon cluster drain` is NOT_SERVING (and /readyz 503, from the same readiness) until
undrained; reflection lists google.pubsub.v1.Publisher and describes every service it lists."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pigeon.testing.cluster import node_process, wipe
from tests.e2e.test_rest import call

pytestmark = pytest.mark.e2e

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
PUBSUB = ("", "google.pubsub.v1.Publisher", "google.pubsub.v1.Subscriber")


def check(channel: grpc.Channel, service: str = "") -> int:
    """What grpc_health_probe does: one Check with a deadline."""
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def await_status(channel: grpc.Channel, want: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := check(channel)) != want:
        assert time.monotonic() < deadline, f"health stayed {got}, expected {want}"
        time.sleep(0.1)


def reflect(channel: grpc.Channel, *requests: reflection_pb2.ServerReflectionRequest) -> list:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    return list(stub.ServerReflectionInfo(iter(requests), timeout=10))


def test_a_ready_node_serves_health_and_reflection_and_stops_serving_at_sigterm(server_factory):
    node = server_factory()
    with grpc.insecure_channel(node.address) as channel:
        assert [check(channel, s) for s in PUBSUB] == [SERVING] * 3
        with pytest.raises(grpc.RpcError) as e:
            check(channel, "no.such.Service")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND

        listed = reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))[0]
        services = [s.name for s in listed.list_services_response.service]
        assert {"google.pubsub.v1.Publisher", "google.pubsub.v1.Subscriber", "pigeon.v1.Queue",
                "grpc.health.v1.Health"} <= set(services)
        # grpcurl's `describe`: each listed service's file, with its imports, from which it can be rebuilt
        answers = reflect(channel, *(reflection_pb2.ServerReflectionRequest(file_containing_symbol=s)
                                     for s in services))
        for name, answer in zip(services, answers):
            assert answer.WhichOneof("message_response") == "file_descriptor_response", (name, answer)
            files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                     for b in answer.file_descriptor_response.file_descriptor_proto]
            package, _, service = name.rpartition(".")
            assert any(f.package == package and service in [s.name for s in f.service] for f in files), name
        publisher = next(a for s, a in zip(services, answers) if s == "google.pubsub.v1.Publisher")
        methods = {m.name for b in publisher.file_descriptor_response.file_descriptor_proto
                   for s in descriptor_pb2.FileDescriptorProto.FromString(b).service if s.name == "Publisher"
                   for m in s.method}
        assert {"CreateTopic", "Publish", "ListTopics"} <= methods

        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == SERVING
        node.proc.send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING  # before the stream ends: load balancers hear it first
        watch.cancel()
    assert node.proc.wait(20) == 0


def test_a_drained_cluster_node_is_not_serving_until_undrained(etcd, tmp_path):
    """n1 alone (one replica: no peers needed) drained and undrained through the command line."""
    wipe(etcd.endpoint)
    node = node_process(str(tmp_path), etcd.endpoint, "n1", extra=["--replicas", "1", "--ack-quorum", "1"],
                        http=True).start()
    try:
        with grpc.insecure_channel(node.address) as channel:
            await_status(channel, SERVING)
            assert call(node.http, "GET", "/readyz") == (200, {"status": "ready"})

            cli("drain", "n1", etcd.endpoint)
            await_status(channel, NOT_SERVING)
            assert [check(channel, s) for s in PUBSUB] == [NOT_SERVING] * 3
            status, body = call(node.http, "GET", "/readyz")  # the same readiness, said the same way
            assert status == 503 and "drained" in body["why"], body

            cli("undrain", "n1", etcd.endpoint)
            await_status(channel, SERVING)
            assert call(node.http, "GET", "/readyz")[0] == 200
    finally:
        node.kill()


def cli(verb: str, node: str, etcd: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", verb, node, "--etcd", etcd],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
