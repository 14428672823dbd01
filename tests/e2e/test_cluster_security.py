"""A secured cluster: three real nodes with node certificates from one CA and mutual TLS between them. Calls about
another node's bundle are forwarded with the caller's verified principal (never its credential); a principal is
believed only from a peer with a node certificate; the node-to-node storage service answers nodes only. On one
shared port clients present client certificates (and bearer tokens); with a peer port of its own, clients bring
only a token, and only the peer port believes a node's vouching or serves storage."""

from __future__ import annotations

import os
import re
import ssl
import time
import urllib.request

import grpc
import pytest
from google.cloud import pubsub_v1
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.oauth2.credentials import Credentials
from google.pubsub_v1 import types
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from pigeon.core.bundles import bundle_log
from pigeon.node.proto import pigeon_storage_pb2
from pigeon.testing.cluster import (await_status, node_process, open_ledgers, owners, settled_owners,
                                    topic_owned_by, wipe)
from pigeon.testing.server import free_port
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
                 "--auth-token-file", kit.token_file, "--admins", ADMIN,
                 "--metrics-readers", "user:app@example.com"]  # (a scraper with a client certificate)
        nodes[i] = node_process(str(tmp_path), etcd.endpoint, i, extra=extra, http=True).start()
    await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == 3
                 and all(r["bundles"] for r in st["nodes"]))
    yield kit, nodes
    for n in nodes.values():
        n.kill()


def append_requests(kit, node, name: str) -> dict[str, float]:
    """The Append requests `node` took as a ledger member, by transport, from its /metrics (HTTPS, a client
    certificate: the port asks for one)."""
    ctx = ssl.create_default_context(cafile=kit.ca_path)
    ctx.load_cert_chain(os.path.join(kit.dir, f"{name}.pem"), os.path.join(kit.dir, f"{name}-key.pem"))
    with urllib.request.urlopen(f"https://127.0.0.1:{node.http_port}/metrics", context=ctx, timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^pigeon_cluster_append_requests_total\{transport="(\w+)"\} (\S+)$', text, re.M)}


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
    # … and replicated by n2 to the members of its ledger over their append channels, with mutual TLS
    for member in set(open_ledgers(etcd.endpoint)[bundle_log(topic, 16)]) - {"n2"}:
        taken = append_requests(kit, nodes[member], "client-app")
        assert taken["channel"] > 0 and taken["grpc"] == 0, (member, taken)
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


# --- a peer port: node certificates between nodes, none asked of clients -------------------------------------
@pytest.fixture
def token_only_nodes(etcd, tmp_path):
    """Three nodes whose client ports serve TLS and tokens without asking for client certificates, and whose peer
    ports require node certificates of the cluster's CA."""
    kit = Kit(str(tmp_path / "pki"))
    wipe(etcd.endpoint)
    nodes = {}
    for i in ("n1", "n2", "n3"):
        kit.client_cert(f"node-{i}", node_id=i)
        peer_port = free_port()
        extra = [*kit.serve_args(), "--peer-port", str(peer_port), "--peer-cert",
                 os.path.join(kit.dir, f"node-{i}.pem"), "--peer-key", os.path.join(kit.dir, f"node-{i}-key.pem"),
                 "--peer-ca", kit.ca_path]
        nodes[i] = node_process(str(tmp_path), etcd.endpoint, i, extra=extra)
        nodes[i].peer_address = f"127.0.0.1:{peer_port}"
        nodes[i].start()
    await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == 3
                 and all(r["bundles"] for r in st["nodes"]))
    yield kit, nodes
    for n in nodes.values():
        n.kill()


def test_a_token_only_client_publishes_and_pulls_through_a_node_that_does_not_own_the_topic(token_only_nodes, etcd):
    kit, nodes = token_only_nodes
    topic = topic_owned_by(owners(etcd.endpoint), "n2", "projects/tok-c/topics/routed")
    sub = "projects/tok-c/subscriptions/routed-sub"
    ssl = grpc.ssl_channel_credentials(kit.ca)  # the CA to trust the server; no client certificate

    def official(node):
        host = node.address.replace("127.0.0.1", "localhost")
        return (pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(
                    host=host, credentials=Credentials(kit.admin_token), ssl_channel_credentials=ssl)),
                pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(
                    host=host, credentials=Credentials(kit.admin_token), ssl_channel_credentials=ssl)))

    pub1, sub1 = official(nodes["n1"])
    _, sub3 = official(nodes["n3"])
    pub1.create_topic(name=topic)
    sub3.create_subscription(name=sub, topic=topic)  # made at the owner n2, through n3
    # forwarded to n2: only over the peer port, as n2's client port believes no principal a caller vouches for
    assert pub1.publish(topic, b"token only, through n1").result(timeout=15)
    got = sub1.pull(subscription=sub, max_messages=10, timeout=15).received_messages  # through n1 again
    assert [m.message.data for m in got] == [b"token only, through n1"]
    sub1.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in got])
    # nobody's token is refused through any node, forwarded or not
    nobody = kit.token("user:nobody@example.com")
    publish = types.PublishRequest.pb()(topic=topic, messages=[{"data": b"x"}]).SerializeToString()
    for n in nodes.values():
        assert call(kit.channel(n.address), P + "Publish", publish, nobody)[0] == grpc.StatusCode.PERMISSION_DENIED


def test_with_a_peer_port_only_a_node_on_it_may_vouch_for_a_caller_or_use_the_storage_service(token_only_nodes):
    kit, nodes = token_only_nodes
    n1 = nodes["n1"]
    topic = "projects/tok-d/topics/spoofed"
    create = types.Topic.pb()(name=topic).SerializeToString()
    spoof = [("x-pigeon-principal", ADMIN), ("x-pigeon-forwarded", "n2")]
    eve = kit.token("user:eve@example.com")
    fence = pigeon_storage_pb2.FenceRequest(ledger=1).SerializeToString()

    def attempt(channel, method, request, metadata, timeout=10):
        try:
            channel.unary_unary(method)(request, metadata=metadata, timeout=timeout)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()

    # the client port: a token-holder claiming to be forwarded for the admin is eve, and nobody else
    client_port = kit.channel(n1.address)
    assert attempt(client_port, P + "CreateTopic", create, spoof + [("authorization", f"Bearer {eve}")]) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert attempt(client_port, P + "CreateTopic", create, spoof) == grpc.StatusCode.UNAUTHENTICATED
    # … even when it holds a node's certificate: the client port asks for none, and believes no vouching
    node_cert = (open(os.path.join(kit.dir, "node-n2.pem"), "rb").read(),
                 open(os.path.join(kit.dir, "node-n2-key.pem"), "rb").read())
    assert attempt(kit.channel(n1.address, node_cert), P + "CreateTopic", create, spoof) == \
        grpc.StatusCode.UNAUTHENTICATED
    # the storage service is not on the client port at all, not even for the admin's token
    assert attempt(client_port, "/pigeon.v1.Storage/Fence", fence, [("authorization", f"Bearer {kit.admin_token}")]) \
        == grpc.StatusCode.UNIMPLEMENTED
    # the peer port: no TLS handshake without a certificate of the cluster's CA …
    peer_no_cert = kit.channel(n1.peer_address)
    assert attempt(peer_no_cert, "/pigeon.v1.Storage/Fence", fence,
                   [("authorization", f"Bearer {kit.admin_token}")], timeout=3) == grpc.StatusCode.UNAVAILABLE
    assert attempt(peer_no_cert, P + "CreateTopic", create, spoof, timeout=3) == grpc.StatusCode.UNAVAILABLE
    # … and a certificate of that CA that names no node gets nothing there
    client = kit.client_cert("client-eve", email="eve@example.com")
    peer_client_cert = kit.channel(n1.peer_address, client)
    assert attempt(peer_client_cert, "/pigeon.v1.Storage/Fence", fence, None) == grpc.StatusCode.PERMISSION_DENIED
    assert attempt(peer_client_cert, P + "CreateTopic", create, spoof) == grpc.StatusCode.PERMISSION_DENIED
    # a node's certificate on the peer port may vouch (as n2 does when it forwards the admin's call)
    assert attempt(kit.channel(n1.peer_address, node_cert), P + "CreateTopic", create,
                   [("x-pigeon-principal", ADMIN)]) == grpc.StatusCode.OK


def test_a_machines_workers_join_a_secured_cluster_with_its_node_certificate(etcd, tmp_path):
    """`--workers 2 --etcd …` on a secured cluster: workers n1.w0 and n1.w1 prove they are nodes with n1's node
    certificate (their peer ports and append channels ask peers for one too) and own bundles beside n2 and n3; a
    client with a certificate and a token reaches topics of all four through n1's one port — created, published
    to and pulled from, with the ledgers replicated over mutual TLS."""
    kit = Kit(str(tmp_path / "pki"))
    wipe(etcd.endpoint)

    def secured(node: str) -> list[str]:
        kit.client_cert(f"node-{node}", node_id=node)
        return ["--tls-cert", os.path.join(kit.dir, f"node-{node}.pem"), "--tls-key",
                os.path.join(kit.dir, f"node-{node}-key.pem"), "--tls-client-ca", kit.ca_path,
                "--auth-token-file", kit.token_file, "--admins", ADMIN]

    machine = node_process(str(tmp_path), etcd.endpoint, "n1", extra=secured("n1") + ["--workers", "2"])
    machine.start(timeout=60)
    others = [node_process(str(tmp_path), etcd.endpoint, n, extra=secured(n)).start() for n in ("n2", "n3")]
    try:
        nodes = {"n1.w0", "n1.w1", "n2", "n3"}
        await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and {r["node"] for r in st["nodes"] if
                                                                        r["state"] == "up" and r["bundles"]} == nodes
                     and st["ledgers"]["open"] >= st["bundles"], timeout=60, what="four nodes to own bundles")
        assert all(sum(n.startswith("n1.") for n in m) == 1 for m in open_ledgers(etcd.endpoint).values())
        ch = kit.channel(machine.address, kit.client_cert("client-app", email="app@example.com"))
        owner_of, admin = settled_owners(etcd.endpoint), kit.admin_token
        for n in sorted(nodes):
            topic = topic_owned_by(owner_of, n, f"projects/sec-w/topics/on-{n}")
            sub = f"projects/sec-w/subscriptions/on-{n}"
            assert call(ch, P + "CreateTopic", types.Topic.pb()(name=topic).SerializeToString(), admin)[0] == \
                grpc.StatusCode.OK
            assert call(ch, S + "CreateSubscription", types.Subscription.pb()(name=sub, topic=topic)
                        .SerializeToString(), admin)[0] == grpc.StatusCode.OK
            publish = types.PublishRequest.pb()(topic=topic, messages=[{"data": n.encode()}]).SerializeToString()
            code, details, _ = call(ch, P + "Publish", publish, admin)
            assert code == grpc.StatusCode.OK, (n, details)
            pulled = []
            deadline = time.monotonic() + 30
            while not pulled and time.monotonic() < deadline:
                code, details, out = call(ch, S + "Pull", types.PullRequest.pb()(subscription=sub, max_messages=5)
                                          .SerializeToString(), admin)
                assert code == grpc.StatusCode.OK, (n, details)
                pulled = [m.message.data for m in types.PullResponse.pb().FromString(out).received_messages]
            assert pulled == [n.encode()], (n, pulled)
    finally:
        machine.stop(timeout=60)
        for o in others:
            o.kill()


def test_a_projects_publish_quota_is_the_clusters_not_each_nodes(etcd, tmp_path):
    """Two clients publish flat out to one project through two nodes of a cluster whose publish quota is 100 kB/s
    a project: together they get about the project's quota, not a quota each (which would be twice it), and
    about half each; the refusals carry the project's quota. The nodes share it out through etcd every second."""
    import threading
    import time

    kit = Kit(str(tmp_path / "pki"))
    wipe(etcd.endpoint)
    nodes = {}
    quota = 100_000
    try:
        for i in ("n1", "n2", "n3"):
            kit.client_cert(f"node-{i}", node_id=i)
            extra = [*kit.serve_args(more=("--publish-bytes-per-s", str(quota))), "--peer-port", str(free_port()),
                     "--peer-cert", os.path.join(kit.dir, f"node-{i}.pem"), "--peer-key",
                     os.path.join(kit.dir, f"node-{i}-key.pem"), "--peer-ca", kit.ca_path]
            nodes[i] = node_process(str(tmp_path), etcd.endpoint, i, extra=extra, http=True).start()
        await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and len(st["nodes"]) == 3
                     and all(r["bundles"] for r in st["nodes"]))
        admin = kit.admin_token
        topic = "projects/shared-quota/topics/flat-out"
        assert call(kit.channel(nodes["n1"].address), P + "CreateTopic",
                    types.Topic.pb()(name=topic).SerializeToString(), admin)[0] == grpc.StatusCode.OK
        request = types.PublishRequest.pb()(topic=topic, messages=[{"data": os.urandom(10_000)}]).SerializeToString()
        start = time.monotonic()
        window = (start + 3.0, start + 9.0)  # (after the first exchanges)
        passed = {"n1": 0, "n2": 0}
        refusals: list[str] = []

        def flat_out(node: str) -> None:
            ch = kit.channel(nodes[node].address)
            while (now := time.monotonic()) < window[1]:
                code, details, _ = call(ch, P + "Publish", request, admin, timeout=30)
                if code == grpc.StatusCode.OK:
                    if now >= window[0]:
                        passed[node] += len(request)
                elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    refusals.append(details)
                else:
                    raise AssertionError(f"{node}: {code} {details}")

        threads = [threading.Thread(target=flat_out, args=(n,)) for n in passed]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        seconds = window[1] - window[0]
        total = sum(passed.values())
        assert total <= 1.4 * quota * seconds, f"{total / seconds:,.0f} B/s through two nodes: a quota each"
        assert total >= 0.5 * quota * seconds, f"{total / seconds:,.0f} B/s: the quota was not served"
        assert min(passed.values()) >= 0.35 * total, f"not an equal part each: {passed}"
        assert refusals and all(f"limit {quota} bytes per second" in r for r in refusals), refusals[:3]
        # each node's part, as /metrics shows it: about half for the two that took the calls
        scrape = urllib.request.Request(f"https://localhost:{nodes['n1'].http_port}/metrics",
                                        headers={"Authorization": f"Bearer {admin}"})
        with urllib.request.urlopen(scrape, context=ssl.create_default_context(cafile=kit.ca_path), timeout=10) as r:
            text = r.read().decode()
        share = re.search(r'^pigeon_project_quota_share\{project="shared-quota",quota="publish-bytes-per-second"\} '
                          r'(\S+)$', text, re.M)
        assert share and 0.3 <= float(share.group(1)) <= 0.7, share and share.group(0)
    finally:
        for n in nodes.values():
            n.kill()
