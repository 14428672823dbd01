"""A secured cluster: three real nodes with node certificates from one CA and mutual TLS between them; clients
present client certificates and bearer tokens. Calls about another node's bundle are forwarded with the caller's
verified principal (never its credential); a principal is believed only from a peer with a node certificate;
the node-to-node storage service answers nodes only."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.pubsub_v1 import types

from pigeon.node.proto import pigeon_storage_pb2
from pigeon.testing.cluster import await_status, node_process, owners, topic_owned_by, wipe
from tests.e2e.security_kit import ADMIN, Kit, call

pytestmark = pytest.mark.e2e
P, S = "/google.pubsub.v1.Publisher/", "/google.pubsub.v1.Subscriber/"


@pytest.fixture
def secured_nodes(etcd, tmp_path):
    kit = Kit(str(tmp_path / "pki"))
    wipe(etcd.endpoint)
    nodes = {}
    for i in ("n1", "n2", "n3"):
        cert, key = kit.client_cert(f"node-{i}", node_id=i)
        extra = ["--tls-cert", os.path.join(kit.dir, f"node-{i}.pem"), "--tls-key",
                 os.path.join(kit.dir, f"node-{i}-key.pem"), "--tls-client-ca", kit.ca_path,
                 "--auth-token-file", kit.token_file, "--admins", ADMIN]
        nodes[i] = node_process(str(tmp_path), etcd.endpoint, i, extra=extra).start()
    await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == 3
                 and all(r["bundles"] for r in st["nodes"]))
    yield kit, nodes
    for n in nodes.values():
        n.kill()


def test_forwarded_calls_carry_the_verified_principal_over_mutual_tls(secured_nodes, etcd):
    kit, nodes = secured_nodes
    client = kit.client_cert("client-app", email="app@example.com")
    ch = {i: kit.channel(n.address, client) for i, n in nodes.items()}
    topic = topic_owned_by(owners(etcd.endpoint), "n2", "projects/sec-c/topics/owned")
    sub = "projects/sec-c/subscriptions/owned-sub"
    admin = kit.admin_token
    assert call(ch["n1"], P + "CreateTopic", types.Topic.pb()(name=topic).SerializeToString(), admin)[0] == \
        grpc.StatusCode.OK
    assert call(ch["n3"], S + "CreateSubscription", types.Subscription.pb()(name=sub, topic=topic)
                .SerializeToString(), admin)[0] == grpc.StatusCode.OK
    worker = "serviceAccount:worker@sec-c.iam.gserviceaccount.com"
    policy = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.subscriber", members=[worker])])
    assert call(ch["n1"], "/google.iam.v1.IAMPolicy/SetIamPolicy", iam_policy_pb2.SetIamPolicyRequest(
        resource=sub, policy=policy).SerializeToString(), admin)[0] == grpc.StatusCode.OK
    publish = types.PublishRequest.pb()(topic=topic, messages=[{"data": b"through n1"}]).SerializeToString()
    assert call(ch["n1"], P + "Publish", publish, admin)[0] == grpc.StatusCode.OK  # forwarded to n2
    # the worker pulls through n3 (forwarded to the owner n2) once n3 has applied the policy
    pull = types.PullRequest.pb()(subscription=sub, max_messages=10).SerializeToString()
    code, details, raw = call(ch["n3"], S + "Pull", pull, kit.token(worker), timeout=15)
    for _ in range(50):
        if code != grpc.StatusCode.PERMISSION_DENIED:
            break
        time.sleep(0.1)
        code, details, raw = call(ch["n3"], S + "Pull", pull, kit.token(worker), timeout=15)
    assert code == grpc.StatusCode.OK, details
    assert [m.message.data for m in types.PullResponse.pb().FromString(raw).received_messages] == [b"through n1"]
    # someone without a role is refused through any node, forwarded or not
    nobody = kit.token("user:nobody@example.com")
    for i in ("n1", "n2", "n3"):
        assert call(ch[i], P + "Publish", publish, nobody)[0] == grpc.StatusCode.PERMISSION_DENIED


def test_only_a_node_may_vouch_for_a_caller_or_use_the_storage_service(secured_nodes, etcd):
    kit, nodes = secured_nodes
    client = kit.client_cert("client-eve", email="eve@example.com")
    ch = kit.channel(nodes["n1"].address, client)
    topic = "projects/sec-d/topics/spoofed"
    spoof = [("x-pigeon-principal", ADMIN), ("x-pigeon-forwarded", "n2")]
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary(P + "CreateTopic")(types.Topic.pb()(name=topic).SerializeToString(), metadata=spoof,
                                           timeout=10)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED  # eve's certificate speaks for eve only
    fence = pigeon_storage_pb2.FenceRequest(ledger=1).SerializeToString()
    assert call(ch, "/pigeon.v1.Storage/Fence", fence, kit.admin_token)[0] == grpc.StatusCode.PERMISSION_DENIED
    # a node's certificate may (here: the admin creates through n1 on behalf of itself, as n2 would forward)
    node_ch = kit.channel(nodes["n1"].address, (open(os.path.join(kit.dir, "node-n2.pem"), "rb").read(),
                                                open(os.path.join(kit.dir, "node-n2-key.pem"), "rb").read()))
    assert node_ch.unary_unary(P + "CreateTopic")(types.Topic.pb()(name=topic).SerializeToString(),
                                                  metadata=[("x-pigeon-principal", ADMIN)], timeout=10)
