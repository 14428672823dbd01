"""Authentication, authorization, TLS, quotas and the audit log against real `pigeon serve` processes: real TLS
sockets, tokens from a real token file, JWTs signed by a key made here and verified against its JWKS file,
client certificates under mutual TLS, the official Python client with a google-auth credentials object, and
gcloud over HTTPS. Nothing here is timed: waits are bounded only so a failure cannot hang the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.oauth2.credentials import Credentials
from google.pubsub_v1 import types
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from pigeon.testing.server import ServerProcess, free_port
from tests.e2e.security_kit import ADMIN, AUDIENCE, Kit, call, status_details

pytestmark = pytest.mark.e2e
pb = {n: getattr(types, n).pb() for n in ("Topic", "Subscription", "PublishRequest", "PullRequest",
                                          "GetTopicRequest", "ListTopicsRequest", "SeekRequest",
                                          "StreamingPullRequest", "CreateSnapshotRequest", "ListSubscriptionsRequest")}


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    return Kit(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def secure(kit, tmp_path_factory):
    """One node with TLS, the token file, OIDC and an audit log (shared by the tests of this module: each keeps
    to projects of its own)."""
    d = tmp_path_factory.mktemp("secure")
    audit = str(d / "audit.jsonl")
    srv = ServerProcess(str(d / "data"), http=True, extra=kit.serve_args(more=("--audit-log", audit)))
    srv.audit = audit
    srv.start()
    yield srv
    srv.kill()


def clients(kit: Kit, srv, token: str):
    """The official client, authenticating the normal way: a google-auth credentials object carrying a token,
    against a TLS endpoint (not the emulator path)."""
    host = srv.address.replace("127.0.0.1", "localhost")
    ssl = grpc.ssl_channel_credentials(kit.ca)
    pub = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(
        host=host, credentials=Credentials(token), ssl_channel_credentials=ssl))
    sub = pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(
        host=host, credentials=Credentials(token), ssl_channel_credentials=ssl))
    return pub, sub


def grant(pub, resource: str, role: str, *members: str) -> None:
    """Add a binding to a resource's (or a project's) policy, as its admin."""
    policy = pub.get_iam_policy(request={"resource": resource})
    policy.bindings.append(policy_pb2.Binding(role=role, members=list(members)))
    pub.set_iam_policy(request={"resource": resource, "policy": policy})


def revoke(pub, resource: str, member: str) -> None:
    policy = pub.get_iam_policy(request={"resource": resource})
    for b in policy.bindings:
        if member in b.members:
            b.members.remove(member)
    pub.set_iam_policy(request={"resource": resource, "policy": policy})


def test_tls_and_bearer_tokens_with_the_official_client(kit, secure):
    pub, sub = clients(kit, secure, kit.admin_token)
    topic, subscription = "projects/tls-p/topics/orders", "projects/tls-p/subscriptions/orders-sub"
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic)
    assert pub.publish(topic, b"over tls").result(timeout=10)
    got = sub.pull(subscription=subscription, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in got] == [b"over tls"]

    # the official streaming subscriber (StreamingPull) with the same credentials
    received = []
    done = threading.Event()

    def handle(message):
        received.append(message.data)
        message.ack()
        done.set()

    pub.publish(topic, b"streamed over tls").result(timeout=10)
    future = sub.subscribe(subscription, handle)
    try:
        assert done.wait(30)
    finally:
        future.cancel()
    assert b"streamed over tls" in received

    ch = kit.channel(secure.address)
    get = pb["GetTopicRequest"](topic=topic).SerializeToString()
    assert call(ch, "/google.pubsub.v1.Publisher/GetTopic", get)[0] == grpc.StatusCode.UNAUTHENTICATED
    code, details, _ = call(ch, "/google.pubsub.v1.Publisher/GetTopic", get, token="not-a-token")
    assert code == grpc.StatusCode.UNAUTHENTICATED and "invalid authentication credentials" in details
    assert call(ch, "/google.pubsub.v1.Publisher/GetTopic", get, token=kit.admin_token)[0] == grpc.StatusCode.OK
    # the port speaks TLS only: a plaintext client gets nowhere
    plain = grpc.insecure_channel(secure.address)
    assert call(plain, "/google.pubsub.v1.Publisher/GetTopic", get, token=kit.admin_token, timeout=3)[0] in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_jwt_access_tokens_checked_against_the_issuers_keys(kit, secure):
    admin, _ = clients(kit, secure, kit.admin_token)
    topic = "projects/jwt-p/topics/events"
    admin.create_topic(name=topic)
    grant(admin, topic, "roles/pubsub.publisher", "user:alice@example.com")
    ch = kit.channel(secure.address)
    publish = pb["PublishRequest"](topic=topic, messages=[{"data": b"x"}]).SerializeToString()
    P = "/google.pubsub.v1.Publisher/Publish"
    assert call(ch, P, publish, token=kit.jwt("alice@example.com"))[0] == grpc.StatusCode.OK
    alice, _ = clients(kit, secure, kit.jwt("alice@example.com"))
    assert alice.publish(topic, b"through the client").result(timeout=10)

    from cryptography.hazmat.primitives.asymmetric import rsa

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for bad, why in ((kit.jwt("alice@example.com", exp_in=-600), "expired"),
                     (kit.jwt("alice@example.com", aud="https://elsewhere"), "another audience"),
                     (kit.jwt("alice@example.com", iss="https://evil.test"), "another issuer"),
                     (kit.jwt("alice@example.com", key=other), ""),
                     (kit.jwt("alice@example.com", kid="unknown-kid"), "does not list")):
        code, details, _ = call(ch, P, publish, token=bad)
        assert code == grpc.StatusCode.UNAUTHENTICATED and why in details, (why, code, details)
    # a valid token of someone without the role
    code, details, _ = call(ch, P, publish, token=kit.jwt("mallory@example.com"))
    assert code == grpc.StatusCode.PERMISSION_DENIED and details == "User not authorized to perform this action."
    with pytest.raises(exceptions.PermissionDenied):
        clients(kit, secure, kit.jwt("mallory@example.com"))[0].publish(topic, b"no").result(timeout=10)


def test_roles_inherited_from_the_project_missing_roles_and_lists(kit, secure):
    admin, admin_sub = clients(kit, secure, kit.admin_token)
    project = "projects/roles-p"
    admin.create_topic(name=f"{project}/topics/top1")
    for s in ("sub1", "sub2"):
        admin_sub.create_subscription(name=f"{project}/subscriptions/{s}", topic=f"{project}/topics/top1")
    bob, carol = "user:bob@example.com", "user:carol@example.com"
    grant(admin, project, "roles/pubsub.viewer", bob)  # on the project: every resource in it
    grant(admin, project, "roles/pubsub.subscriber", bob)
    grant(admin, f"{project}/subscriptions/sub1", "roles/pubsub.subscriber", carol)  # on one subscription
    grant(admin, f"{project}/subscriptions/sub1", "roles/pubsub.viewer", carol)
    ch = kit.channel(secure.address)
    S = "/google.pubsub.v1.Subscriber/"
    pull = lambda s: pb["PullRequest"](subscription=f"{project}/subscriptions/{s}", max_messages=1,  # noqa: E731
                                       return_immediately=True).SerializeToString()
    tb, tc = kit.token(bob), kit.token(carol)
    assert call(ch, S + "Pull", pull("sub1"), tb)[0] == grpc.StatusCode.OK  # inherited
    assert call(ch, S + "Pull", pull("sub2"), tb)[0] == grpc.StatusCode.OK
    assert call(ch, S + "Pull", pull("sub1"), tc)[0] == grpc.StatusCode.OK  # its own grant
    assert call(ch, S + "Pull", pull("sub2"), tc)[0] == grpc.StatusCode.PERMISSION_DENIED  # missing role
    # a missing resource: NOT_FOUND for who may look, the same PERMISSION_DENIED as an existing one otherwise
    assert call(ch, S + "Pull", pull("nope"), tb)[0] == grpc.StatusCode.NOT_FOUND
    assert call(ch, S + "Pull", pull("nope"), tc)[0:2] == call(ch, S + "Pull", pull("sub2"), tc)[0:2]
    delete = types.DeleteSubscriptionRequest.pb()(subscription=f"{project}/subscriptions/sub1").SerializeToString()
    assert call(ch, S + "DeleteSubscription", delete, tb)[0] == grpc.StatusCode.PERMISSION_DENIED  # viewer
    # lists hold what the caller may see
    lst = pb["ListSubscriptionsRequest"](project=project).SerializeToString()
    resp = types.ListSubscriptionsResponse.pb()
    names = lambda raw: [s.name for s in resp.FromString(raw).subscriptions]  # noqa: E731
    assert names(call(ch, S + "ListSubscriptions", lst, tb)[2]) == [f"{project}/subscriptions/sub1",
                                                                     f"{project}/subscriptions/sub2"]
    assert names(call(ch, S + "ListSubscriptions", lst, tc)[2]) == [f"{project}/subscriptions/sub1"]
    one = pb["ListSubscriptionsRequest"](project=project, page_size=1).SerializeToString()
    first = resp.FromString(call(ch, S + "ListSubscriptions", one, tc)[2])
    assert [s.name for s in first.subscriptions] == [f"{project}/subscriptions/sub1"] and not first.next_page_token
    # TestIamPermissions answers for the caller
    ask = ["pubsub.subscriptions.consume", "pubsub.subscriptions.delete", "pubsub.subscriptions.get"]
    test = lambda s, tok: list(iam_policy_pb2.TestIamPermissionsResponse.FromString(call(  # noqa: E731
        ch, "/google.iam.v1.IAMPolicy/TestIamPermissions", iam_policy_pb2.TestIamPermissionsRequest(
            resource=f"{project}/subscriptions/{s}", permissions=ask).SerializeToString(), tok)[2]).permissions)
    assert test("sub2", tb) == ["pubsub.subscriptions.consume", "pubsub.subscriptions.get"]
    assert test("sub2", tc) == []
    assert test("nope", tc) == []  # not NOT_FOUND: carol learns nothing about what exists
    assert test("sub1", kit.admin_token) == ask


def _stream(ch, subscription: str, token: str):
    """Open a StreamingPull held open by the caller; returns (response iterator, a function that closes it)."""
    stop = threading.Event()

    def requests():
        yield pb["StreamingPullRequest"](subscription=subscription, stream_ack_deadline_seconds=10).SerializeToString()
        stop.wait(60)

    call_ = ch.stream_stream("/google.pubsub.v1.Subscriber/StreamingPull")(
        requests(), metadata=[("authorization", f"Bearer {token}")])
    return call_, stop.set


def _stream_end(call_, limit_s: float = 30.0):
    """Read the stream until it ends; returns its status code (None if it had not ended within the bound)."""
    out = {}

    def read():
        try:
            for _ in call_:
                pass
            out["code"] = grpc.StatusCode.OK
        except grpc.RpcError as e:
            out["code"] = e.code()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(limit_s)
    return out.get("code")


def test_a_revoked_policy_ends_open_streams(kit, secure):
    admin, admin_sub = clients(kit, secure, kit.admin_token)
    project = "projects/revoke-p"
    topic, subscription = f"{project}/topics/feed", f"{project}/subscriptions/feed-sub"
    admin.create_topic(name=topic)
    admin_sub.create_subscription(name=subscription, topic=topic)
    dave = "user:dave@example.com"
    grant(admin, subscription, "roles/pubsub.subscriber", dave)
    ch = kit.channel(secure.address)
    stream, close = _stream(ch, subscription, kit.token(dave))
    admin.publish(topic, b"before").result(timeout=10)
    first = types.StreamingPullResponse.pb().FromString(next(iter(stream)))
    assert [m.message.data for m in first.received_messages] == [b"before"]  # the stream was serving
    revoke(admin, subscription, dave)
    try:
        assert _stream_end(stream) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        close()
    # reopening is refused as well
    again, close2 = _stream(ch, subscription, kit.token(dave))
    try:
        assert _stream_end(again) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        close2()


def test_a_tenant_cannot_reach_another_tenants_messages_by_any_path(kit, secure):
    admin, admin_sub = clients(kit, secure, kit.admin_token)
    a, b = "projects/tenant-a", "projects/tenant-b"
    for p in (a, b):
        admin.create_topic(name=f"{p}/topics/top")
        admin_sub.create_subscription(name=f"{p}/subscriptions/sub", topic=f"{p}/topics/top")
    admin_sub.create_snapshot(name=f"{b}/snapshots/snap", subscription=f"{b}/subscriptions/sub")
    admin.publish(f"{b}/topics/top", b"secret of b").result(timeout=10)
    eve = "serviceAccount:eve@tenant-a.iam.gserviceaccount.com"
    grant(admin, a, "roles/pubsub.editor", eve)  # everything in A, nothing in B
    tok = kit.token(eve)
    ch = kit.channel(secure.address)
    S, P = "/google.pubsub.v1.Subscriber/", "/google.pubsub.v1.Publisher/"
    denied = grpc.StatusCode.PERMISSION_DENIED
    bsub = f"{b}/subscriptions/sub"
    tries = {
        "pull": (S + "Pull", pb["PullRequest"](subscription=bsub, max_messages=10, return_immediately=True)),
        "seek to B's snapshot": (S + "Seek", pb["SeekRequest"](subscription=f"{a}/subscriptions/sub",
                                                                snapshot=f"{b}/snapshots/snap")),
        "subscription in A on B's topic": (S + "CreateSubscription", pb["Subscription"](
            name=f"{a}/subscriptions/on-b", topic=f"{b}/topics/top")),
        "subscription in B": (S + "CreateSubscription", pb["Subscription"](name=f"{b}/subscriptions/mine",
                                                                           topic=f"{b}/topics/top")),
        "dead letters into B": (S + "CreateSubscription", pb["Subscription"](
            name=f"{a}/subscriptions/dl", topic=f"{a}/topics/top",
            dead_letter_policy={"dead_letter_topic": f"{b}/topics/top", "max_delivery_attempts": 5})),
        "snapshot of B's subscription": (S + "CreateSnapshot", pb["CreateSnapshotRequest"](
            name=f"{a}/snapshots/copy", subscription=bsub)),
        "B's topic": (P + "GetTopic", pb["GetTopicRequest"](topic=f"{b}/topics/top")),
        "queue take": ("/pigeon.v1.Queue/Take", None),
        "range read": ("/pigeon.v1.Ranges/ReadRange", None),
    }
    from pigeon.api.proto import pigeon_queue_pb2, pigeon_ranges_pb2

    tries["queue take"] = ("/pigeon.v1.Queue/Take", pigeon_queue_pb2.TakeRequest(subscription=bsub, max_messages=10))
    tries["range read"] = ("/pigeon.v1.Ranges/ReadRange", pigeon_ranges_pb2.ReadRangeRequest(
        topic=f"{b}/topics/top", shard=0, start_offset=0, end_offset=1000))
    for what, (method, req) in tries.items():
        assert call(ch, method, req.SerializeToString(), tok)[0] == denied, what
    stream, close = _stream(ch, bsub, tok)
    try:
        assert _stream_end(stream) == denied
    finally:
        close()
    lst = call(ch, P + "ListTopics", pb["ListTopicsRequest"](project=b).SerializeToString(), tok)
    assert lst[0] == grpc.StatusCode.OK and not types.ListTopicsResponse.pb().FromString(lst[2]).topics
    # and what is A's still works: the denials above are about B
    assert call(ch, S + "Pull", pb["PullRequest"](subscription=f"{a}/subscriptions/sub", max_messages=1,
                                                  return_immediately=True).SerializeToString(), tok)[0] == \
        grpc.StatusCode.OK
    # B's message is still there for B
    got = admin_sub.pull(subscription=bsub, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in got] == [b"secret of b"]


def test_the_audit_log_holds_admin_changes_and_refusals(kit, secure):
    admin, _ = clients(kit, secure, kit.admin_token)
    admin.create_topic(name="projects/audit-p/topics/audited")
    with pytest.raises(exceptions.AlreadyExists):
        admin.create_topic(name="projects/audit-p/topics/audited")
    ch = kit.channel(secure.address)
    call(ch, "/google.pubsub.v1.Publisher/DeleteTopic", types.DeleteTopicRequest.pb()(
        topic="projects/audit-p/topics/audited").SerializeToString(), kit.token("user:zed@example.com"))
    lines = [json.loads(x) for x in open(secure.audit)]
    assert {"principal": ADMIN, "method": "/google.pubsub.v1.Publisher/CreateTopic",
            "resource": "projects/audit-p", "outcome": "OK"}.items() <= next(
        x for x in lines if x["method"].endswith("CreateTopic") and x["resource"] == "projects/audit-p").items()
    refused = [x for x in lines if x["principal"] == "user:zed@example.com"]
    assert refused and refused[0]["outcome"] == "PERMISSION_DENIED" and refused[0]["resource"] == \
        "projects/audit-p/topics/audited"
    assert [x["outcome"] for x in lines if x["method"].endswith("CreateTopic") and x["resource"] ==
            "projects/audit-p"] == ["OK", "ALREADY_EXISTS"]  # a change is audited whatever its outcome
    assert all("time" in x for x in lines)


def test_mutual_tls_identity(kit, tmp_path):
    srv = ServerProcess(str(tmp_path / "data"), http=True, extra=kit.serve_args(mtls=True)).start()
    try:
        ch = kit.channel(srv.address, kit.client_cert("client-admin", email="admin@ops.iam.gserviceaccount.com"))
        create = pb["Topic"](name="projects/mtls-p/topics/by-cert").SerializeToString()
        assert call(ch, "/google.pubsub.v1.Publisher/CreateTopic", create)[0] == grpc.StatusCode.OK
        other = kit.channel(srv.address, kit.client_cert("client-other", email="other@example.com"))
        get = pb["GetTopicRequest"](topic="projects/mtls-p/topics/by-cert").SerializeToString()
        assert call(other, "/google.pubsub.v1.Publisher/GetTopic", get)[0] == grpc.StatusCode.PERMISSION_DENIED
        # a token, when sent, decides (here: a bad one)
        assert call(ch, "/google.pubsub.v1.Publisher/GetTopic", get, token="bad")[0] == \
            grpc.StatusCode.UNAUTHENTICATED
        # without a certificate the handshake fails
        assert call(kit.channel(srv.address), "/google.pubsub.v1.Publisher/GetTopic", get,
                    token=kit.admin_token, timeout=5)[0] == grpc.StatusCode.UNAVAILABLE
        # over HTTPS the REST front verifies the certificate and passes its identity on
        import ssl
        import urllib.request

        def rest(name: str):
            ctx = ssl.create_default_context(cafile=kit.ca_path)
            ctx.load_cert_chain(os.path.join(kit.dir, f"{name}.pem"), os.path.join(kit.dir, f"{name}-key.pem"))
            url = srv.http.replace("http://127.0.0.1", "https://localhost") + "/v1/projects/mtls-p/topics/by-cert"
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        assert rest("client-admin") == (200, {"name": "projects/mtls-p/topics/by-cert", "state": "ACTIVE"})
        code, body = rest("client-other")
        assert code == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    finally:
        srv.kill()


def test_quotas_per_project_with_quota_failure_details(kit, tmp_path):
    srv = ServerProcess(str(tmp_path / "data"), http=True, extra=kit.serve_args(more=(
        "--publish-bytes-per-s", "20000")), env={"PIGEON_ADMIN_OPS_PER_MIN": "4"}).start()  # (flag and environment)
    try:
        ch = kit.channel(srv.address)
        P = "/google.pubsub.v1.Publisher/"
        tok = kit.admin_token
        for p in ("noisy", "quiet"):
            assert call(ch, P + "CreateTopic", pb["Topic"](name=f"projects/{p}/topics/top").SerializeToString(),
                        tok)[0] == grpc.StatusCode.OK
        big = lambda p: pb["PublishRequest"](topic=f"projects/{p}/topics/top", messages=[  # noqa: E731
            {"data": os.urandom(15_000)}]).SerializeToString()
        assert call(ch, P + "Publish", big("noisy"), tok)[0] == grpc.StatusCode.OK
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(P + "Publish")(big("noisy"), metadata=[("authorization", f"Bearer {tok}")], timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        quota, retry = status_details(e.value)
        assert quota.violations[0].subject == "projects/noisy" and "publish-bytes-per-second" in \
            quota.violations[0].description
        assert 0 < retry.retry_delay.ToNanoseconds() <= 1_000_000_000
        # another project's quota is its own
        assert call(ch, P + "Publish", big("quiet"), tok)[0] == grpc.StatusCode.OK
        # admin operations per minute: one create spent, three more pass, the fifth is refused
        for i in range(3):
            assert call(ch, P + "CreateTopic", pb["Topic"](name=f"projects/noisy/topics/xtopic{i}").SerializeToString(),
                        tok)[0] == grpc.StatusCode.OK
        assert call(ch, P + "CreateTopic", pb["Topic"](name="projects/noisy/topics/xtopic9").SerializeToString(),
                    tok)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        # over REST: Google's JSON error shape with the details
        import ssl
        import urllib.request

        req = urllib.request.Request(srv.http.replace("http://127.0.0.1", "https://localhost") +
                                     "/v1/projects/noisy/topics/xtopic8", method="PUT", data=b"{}",
                                     headers={"Authorization": f"Bearer {tok}"})
        with pytest.raises(urllib.error.HTTPError) as he:
            urllib.request.urlopen(req, context=ssl.create_default_context(cafile=kit.ca_path), timeout=10)
        body = json.loads(he.value.read())
        assert he.value.code == 429 and body["error"]["status"] == "RESOURCE_EXHAUSTED"
        kinds = [d["@type"] for d in body["error"]["details"]]
        assert kinds == ["type.googleapis.com/google.rpc.QuotaFailure", "type.googleapis.com/google.rpc.RetryInfo"]
        scrape = urllib.request.Request(srv.http.replace("http://127.0.0.1", "https://localhost") + "/metrics",
                                        headers={"Authorization": f"Bearer {kit.admin_token}"})
        with urllib.request.urlopen(scrape, context=ssl.create_default_context(cafile=kit.ca_path), timeout=10) as r:
            metrics = r.read().decode()
        assert 'pigeon_project_quota_exceeded_total{project="noisy",quota="publish-bytes-per-second"} 1.0' in metrics
        assert 'pigeon_project_publish_bytes_total{project="quiet"}' in metrics
    finally:
        srv.kill()


def test_metrics_are_for_the_admins_and_the_metrics_readers(kit, secure):
    """/metrics names every project's resources and traffic: on a node that authenticates, a caller without a
    credential gets 401 and one who is neither an admin nor a metrics reader 403 (Google's JSON error shape); the
    health checks stay open, as load balancers and orchestrators call them without credentials."""
    import ssl
    import time
    import urllib.error
    import urllib.request

    base = secure.http.replace("http://127.0.0.1", "https://localhost")
    ctx = ssl.create_default_context(cafile=kit.ca_path)

    def get(path: str, token: str | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    status, body = get("/metrics")
    assert status == 401 and json.loads(body)["error"]["status"] == "UNAUTHENTICATED"
    eve, deadline = kit.token("user:metrics-eve@example.com"), time.monotonic() + 30
    while (status := get("/metrics", eve)[0]) == 401 and time.monotonic() < deadline:
        time.sleep(0.2)  # (a token added to the file is known once the node read the file again: within a second)
    status, body = get("/metrics", eve)
    assert status == 403 and json.loads(body)["error"]["status"] == "PERMISSION_DENIED"
    assert get("/metrics", "not-a-token")[0] == 401
    status, body = get("/metrics", kit.admin_token)
    assert status == 200 and b"pigeon_" in body
    assert get("/healthz")[0] == 200 and get("/readyz")[0] == 200


def test_non_loopback_without_authentication_refuses_to_start(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pigeon", "serve", "--host", "0.0.0.0", "--port", str(free_port()),
                          "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "without authentication" in out.stderr and "--insecure" in out.stderr


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="the gcloud CLI is not installed")
def test_gcloud_over_https_with_an_access_token(kit, secure, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(kit.admin_token)
    env = {"CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": secure.http.replace("http://127.0.0.1", "https://localhost")
           + "/", "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE": kit.ca_path, "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE":
           str(token_file), "CLOUDSDK_CORE_PROJECT": "gcloud-p", "CLOUDSDK_CONFIG": str(tmp_path / "cfg"),
           "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "PATH": "/usr/bin:/bin:/usr/local/bin"}

    def gcloud(*args, env=env):
        return subprocess.run(["gcloud", "pubsub", *args, "--format", "json"], env=env, capture_output=True,
                              text=True, timeout=120)

    assert gcloud("topics", "create", "orders").returncode == 0
    assert gcloud("subscriptions", "create", "orders-sub", "--topic", "orders").returncode == 0
    assert gcloud("topics", "publish", "orders", "--message", "hello").returncode == 0
    got = gcloud("subscriptions", "pull", "orders-sub", "--auto-ack", "--limit", "5")
    assert got.returncode == 0, got.stderr
    assert [m["message"]["data"] for m in json.loads(got.stdout)] == ["aGVsbG8="]
    (tmp_path / "bad").write_text("not-a-token")
    bad = gcloud("topics", "list", env={**env, "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(tmp_path / "bad")})
    assert bad.returncode != 0 and ("UNAUTHENTICATED" in bad.stderr or "401" in bad.stderr)


def test_the_command_line_against_a_secured_server(kit, secure, tmp_path):
    (tmp_path / "token").write_text(kit.admin_token)
    address = secure.address.replace("127.0.0.1", "localhost")

    def pigeon(*args, token: str = str(tmp_path / "token")):
        return subprocess.run([sys.executable, "-m", "pigeon", "--ca-file", kit.ca_path, "--token-file", token,
                               *args, "--address", address], capture_output=True, text=True, timeout=60)

    assert pigeon("topics", "create", "projects/cli-p/topics/jobs").returncode == 0
    assert pigeon("subscriptions", "create", "projects/cli-p/subscriptions/jobs-w", "--topic",
                  "projects/cli-p/topics/jobs").returncode == 0
    assert pigeon("publish", "projects/cli-p/topics/jobs", "job-1", "--ordering-key", "k").returncode == 0
    taken = pigeon("queue", "take", "projects/cli-p/subscriptions/jobs-w", "--format", "json")
    assert taken.returncode == 0 and ("job-1" in taken.stdout or "am9iLTE=" in taken.stdout), taken.stderr
    listed = pigeon("topics", "list", "--project", "cli-p", "--format", "json")
    assert listed.returncode == 0 and "projects/cli-p/topics/jobs" in listed.stdout
    (tmp_path / "bad").write_text("nope")
    bad = pigeon("topics", "list", "--project", "cli-p", token=str(tmp_path / "bad"))
    assert bad.returncode == 1 and "UNAUTHENTICATED" in bad.stderr


def _presented(port: int, ca_path: str) -> str:
    """The SHA-256 of the certificate a server presents on a new TLS connection (ALPN h2, as gRPC clients ask)."""
    import hashlib
    import socket
    import ssl

    ctx = ssl.create_default_context(cafile=ca_path)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        return hashlib.sha256(s.getpeercert(binary_form=True)).hexdigest()


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path):
    """A renewal tool writes a new certificate and key over the files the node was started with: the gRPC and the
    HTTPS port present it on their next connections, the official client works on; a key that is not the
    certificate's changes nothing and is logged."""
    import hashlib
    import ssl
    import time

    from pigeon.ops import certs

    kit = Kit(str(tmp_path / "pki"))  # a kit of its own: this test writes over its server certificate
    srv = ServerProcess(str(tmp_path / "data"), http=True, extra=kit.serve_args()).start()
    ports = (srv.port, srv.http_port)

    def until_presented(fingerprint: str) -> None:
        deadline = time.monotonic() + 30
        while {_presented(p, kit.ca_path) for p in ports} != {fingerprint}:
            assert time.monotonic() < deadline, f"the ports still present {[_presented(p, kit.ca_path) for p in ports]}"
            time.sleep(0.2)

    try:
        pub, _ = clients(kit, srv, kit.admin_token)
        pub.create_topic(name="projects/renewed/topics/renewal")
        first = hashlib.sha256(ssl.PEM_cert_to_DER_cert(open(kit.server_cert).read())).hexdigest()
        until_presented(first)
        certs.issue(kit.dir, "server", hosts=["localhost", "127.0.0.1"])  # the renewal, in place
        renewed = hashlib.sha256(ssl.PEM_cert_to_DER_cert(open(kit.server_cert).read())).hexdigest()
        assert renewed != first
        until_presented(renewed)
        pub, _ = clients(kit, srv, kit.admin_token)  # a new connection, made with the renewed certificate
        assert pub.publish("projects/renewed/topics/renewal", b"after the renewal").result(timeout=30)

        certs.issue(kit.dir, "stray", hosts=["localhost"])
        shutil.copy(os.path.join(kit.dir, "stray-key.pem"), kit.server_key)
        deadline = time.monotonic() + 30
        while "do not make a valid set" not in open(srv.log_path).read():
            assert time.monotonic() < deadline, "the bad key was not reported"
            time.sleep(0.2)
        assert {_presented(p, kit.ca_path) for p in ports} == {renewed}
        pub, _ = clients(kit, srv, kit.admin_token)
        assert pub.publish("projects/renewed/topics/renewal", b"after a bad copy").result(timeout=30)
        assert srv.proc.poll() is None
    finally:
        srv.kill()
