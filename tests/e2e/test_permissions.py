"""The permission table test, generated from the permission map (pigeon.api.permissions.RULES): for every method
a single node serves, a caller holding nothing is refused PERMISSION_DENIED (a list answers empty), a caller
granted the smallest predefined role(s) covering what the method needs — on the project, and (where the need is
the resource itself) on the resource only — gets past the check (any answer but PERMISSION_DENIED or
UNAUTHENTICATED: the request itself may be incomplete). Each method gets resources of its own, so a delete
does not take another case's away. Against a real node with TLS and bearer tokens."""

from __future__ import annotations

import grpc
import pytest
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.protobuf import descriptor_pool, message_factory
from google.pubsub_v1 import types

from pigeon.api.permissions import RULES
from pigeon.broker import iam
from pigeon.testing.server import ServerProcess
from tests.e2e.security_kit import Kit, call

pytestmark = pytest.mark.e2e
PROJECT = "projects/tbl"
NODE_ONLY = {m for m, r in RULES.items() if any(n.on == "node" for n in r.needs)}  # a cluster's (test_cluster_security)
SERVED = sorted(set(RULES) - NODE_ONLY)


def _request_classes() -> dict[str, type]:
    from pigeon.api.proto import pigeon_monitoring_pb2, pigeon_queue_pb2, pigeon_ranges_pb2
    from pigeon.api.rest_routes import compiled_protos

    import google.pubsub_v1.types  # noqa: F401 — the library's messages (newer than its shipped protos)

    pool = descriptor_pool.DescriptorPool()
    files = compiled_protos()
    for f in files.file:
        pool.Add(f)

    def cls(full):
        try:
            return message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(full))
        except KeyError:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(full))

    out = {}
    for f in files.file:
        if f.package == "google.pubsub.v1":
            for svc in f.service:
                for m in svc.method:
                    out[f"/google.pubsub.v1.{svc.name}/{m.name}"] = cls(m.input_type.lstrip("."))
    for svc in ("Publisher", "Subscriber", "SchemaService"):  # methods the shipped protos predate
        for rule in RULES:
            if rule.startswith(f"/google.pubsub.v1.{svc}/") and rule not in out:
                out[rule] = getattr(types, rule.rsplit("/", 1)[1] + "Request").pb()
    for mod in (iam_policy_pb2, pigeon_queue_pb2, pigeon_ranges_pb2, pigeon_monitoring_pb2):
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                out[f"/{svc.full_name}/{m.name}"] = message_factory.GetMessageClass(m.input_type)
    return out


def _set(msg, path: str, value: str) -> None:
    *parents, last = path.split(".")
    for p in parents:
        msg = getattr(msg, p)
    setattr(msg, last, value)


def _kind(permission: str) -> str:
    return permission.split(".")[1] if permission.startswith("pubsub.") else "topics"


def _permissions(method: str, res: dict) -> set[str]:
    out = set()
    for n in RULES[method].needs:
        if n.on == "iam":
            out.add(f"pubsub.topics.{n.permission}")
        elif n.on not in ("node", "admin") and n.required:
            out.add(n.permission)
    return out


def _smallest_role(perms: set[str]) -> str:
    for role, held in sorted(iam.ROLES.items(), key=lambda kv: (len(kv[1]), kv[0])):
        if perms <= held:
            return role
    raise AssertionError(f"no predefined role holds {perms}")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    kit = Kit(str(tmp_path_factory.mktemp("pki")))
    d = tmp_path_factory.mktemp("perm")
    srv = ServerProcess(str(d / "data"), extra=kit.serve_args()).start()
    yield kit, srv
    srv.kill()


def _resources(kit, ch, i: int) -> dict:
    """A topic, subscription, snapshot and schema of this case's own (made by the admin)."""
    admin = kit.admin_token
    r = {"topics": f"{PROJECT}/topics/topic-{i}", "subscriptions": f"{PROJECT}/subscriptions/sub-{i}",
         "snapshots": f"{PROJECT}/snapshots/snap-{i}", "schemas": f"{PROJECT}/schemas/schema-{i}"}
    P, S, SC = "/google.pubsub.v1.Publisher/", "/google.pubsub.v1.Subscriber/", "/google.pubsub.v1.SchemaService/"
    steps = [(P + "CreateTopic", types.Topic.pb()(name=r["topics"])),
             (S + "CreateSubscription", types.Subscription.pb()(name=r["subscriptions"], topic=r["topics"])),
             (S + "CreateSnapshot", types.CreateSnapshotRequest.pb()(name=r["snapshots"],
                                                                      subscription=r["subscriptions"])),
             (SC + "CreateSchema", types.CreateSchemaRequest.pb()(
                 parent=PROJECT, schema_id=f"schema-{i}", schema=types.Schema.pb()(
                     type_=2, definition='{"type": "record", "name": "R", "fields": []}')))]
    for method, req in steps:
        code, details, _ = call(ch, method, req.SerializeToString(), admin)
        assert code == grpc.StatusCode.OK, (method, details)
    return r


def _request(method: str, classes, res: dict, i: int):
    req = classes[method]()
    for n in RULES[method].needs:
        if n.on in ("node", "admin"):
            continue
        kind = _kind(n.permission)
        if n.on == "project":
            value = PROJECT if n.field in ("parent", "project") else f"{PROJECT}/{kind}/new-{kind}-{i}"
        elif n.on == "topic_of":
            value = res["subscriptions"]
        elif n.on == "iam":
            value = res["topics"]
        else:
            value = res[kind]
        if not n.required and n.field.endswith("schema"):
            continue  # optional needs are exercised by the isolation tests
        if not n.required:
            continue
        _set(req, n.field, value)
    for f in ("project", "parent"):
        if f in req.DESCRIPTOR.fields_by_name and not getattr(req, f):
            setattr(req, f, PROJECT)
    if "return_immediately" in req.DESCRIPTOR.fields_by_name:
        req.return_immediately = True
    if "max_messages" in req.DESCRIPTOR.fields_by_name:
        req.max_messages = 1
    return req


def _call(ch, method: str, req, token: str):
    if method.endswith("/StreamingPull"):
        try:
            for _ in ch.stream_stream(method)(iter([req.SerializeToString()]), timeout=1.5,
                                               metadata=[("authorization", f"Bearer {token}")]):
                pass
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()
    return call(ch, method, req.SerializeToString(), token, timeout=3)[0]


def _grant(kit, ch, resource: str, role: str, member: str) -> None:
    G = "/google.iam.v1.IAMPolicy/"
    _, _, raw = call(ch, G + "GetIamPolicy", iam_policy_pb2.GetIamPolicyRequest(resource=resource)
                     .SerializeToString(), kit.admin_token)
    policy = policy_pb2.Policy.FromString(raw)
    policy.bindings.append(policy_pb2.Binding(role=role, members=[member]))
    code, details, _ = call(ch, G + "SetIamPolicy", iam_policy_pb2.SetIamPolicyRequest(
        resource=resource, policy=policy).SerializeToString(), kit.admin_token)
    assert code == grpc.StatusCode.OK, details


def test_every_method_is_in_the_map():
    """A method the server serves but the map does not name would be refused to everyone: the map is complete."""
    classes = _request_classes()
    served = {m for m in classes if not m.startswith("/google.iam.v1.IAMPolicy/") or
              m.rsplit("/", 1)[1] in ("GetIamPolicy", "SetIamPolicy", "TestIamPermissions")}
    assert served - set(RULES) == set()


@pytest.mark.parametrize("method", SERVED)
def test_the_permission_each_method_needs(node, method):
    kit, srv = node
    ch = kit.channel(srv.address)
    classes = _request_classes()
    i = SERVED.index(method)
    res = _resources(kit, ch, i)
    rule = RULES[method]
    req = _request(method, classes, res, i)
    denied, unauth = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED
    nobody = kit.token(f"user:nobody-{i}@example.com")
    if rule.needs:
        assert _call(ch, method, req, nobody) == denied, "a caller holding nothing is refused"
    else:
        assert _call(ch, method, req, nobody) == grpc.StatusCode.OK, "a list or TestIamPermissions answers"
    if any(n.on == "admin" for n in rule.needs):
        assert _call(ch, method, req, kit.admin_token) not in (denied, unauth)
        return
    perms = _permissions(method, res)
    if not perms:
        return
    role = _smallest_role(perms)
    holder = f"user:holder-{i}@example.com"
    _grant(kit, ch, PROJECT, role, holder)
    assert _call(ch, method, req, kit.token(holder)) not in (denied, unauth), f"{role} on the project passes"
    # the same role on the resource alone passes too, when the method needs nothing on the project (fresh
    # resources: the call above may have deleted its own)
    required = [n for n in rule.needs if n.required]
    if required and all(n.on in ("self", "iam") for n in required) and \
            len({"topics" if n.on == "iam" else _kind(n.permission) for n in required}) == 1:
        kind = "topics" if required[0].on == "iam" else _kind(required[0].permission)
        fresh = _resources(kit, ch, i + 1000)
        resource_holder = f"user:resource-{i}@example.com"
        _grant(kit, ch, fresh[kind], role, resource_holder)
        req = _request(method, classes, fresh, i + 1000)
        assert _call(ch, method, req, kit.token(resource_holder)) not in (denied, unauth), \
            f"{role} on {fresh[kind]} passes"
        assert _call(ch, method, req, nobody) == denied
