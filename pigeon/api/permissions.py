"""The permission map: for every gRPC method Pigeon serves, the permissions it needs and on which resource —
named by a field of the request — as data. Owns the rule: what each call needs (Pub/Sub's access-control
reference; Pigeon's own services mapped onto the nearest Pub/Sub permission). `api.access` enforces it before
any handler runs, `tests/e2e/test_permissions.py` is generated from it, docs/security.md prints it.

A `Need` says: `permission` on the resource named by request field `field` (a dotted path), taken
  * `self`: as it is (a schema revision `name@rev` counts as its schema);
  * `project`: its project (`projects/P` of the name) — creating things, listing;
  * `topic_of`: the topic of the subscription it names;
  * `iam`: the `pubsub.KIND.<permission>` of the resource's kind (or `resourcemanager.projects.…` for a
    project);
  * `node`: the caller must be a cluster node (node-to-node services);
  * `admin`: the caller must be one of the configured admins (the cluster's layout).
An optional need (`required=False`) applies only when the field is set. A required need whose field is empty
refuses the call (PERMISSION_DENIED): nothing is looked up for a caller who may not ask.
A `Listing` filters a list answer to the items the caller may `get` (keyset paging keeps working: the page
token is the last name the caller saw)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Need:
    permission: str
    field: str
    on: str = "self"  # self | project | topic_of | iam | node
    required: bool = True


@dataclass(frozen=True)
class Listing:
    field: str  # the repeated field of the response
    permission: str  # what the caller needs on an item to see it
    names: bool = False  # the items are names (strings), not messages with a `name`
    response: str = ""  # the response message's full name


@dataclass(frozen=True)
class Rule:
    needs: tuple[Need, ...] = ()
    admin: bool = False  # a change: audited whatever its outcome, counted against the admin quota
    listing: Listing | None = None
    publish: bool = False  # counted against the publish quota (its request bytes)


def _r(*needs: Need, admin: bool = False, listing: Listing | None = None, publish: bool = False) -> Rule:
    return Rule(tuple(needs), admin, listing, publish)


P, S, SC = "/google.pubsub.v1.Publisher/", "/google.pubsub.v1.Subscriber/", "/google.pubsub.v1.SchemaService/"
I, Q, RG, M, ST = ("/google.iam.v1.IAMPolicy/", "/pigeon.v1.Queue/", "/pigeon.v1.Ranges/", "/pigeon.v1.Monitoring/",
                   "/pigeon.v1.Storage/")
_DLT = "dead_letter_policy.dead_letter_topic"  # a dead-letter topic is published to: its owner must allow it
_CONSUME = Need("pubsub.subscriptions.consume", "subscription")

RULES: dict[str, Rule] = {
    # Publisher
    P + "CreateTopic": _r(Need("pubsub.topics.create", "name", "project"),
                          Need("pubsub.schemas.attach", "schema_settings.schema", required=False), admin=True),
    P + "UpdateTopic": _r(Need("pubsub.topics.update", "topic.name"),
                          Need("pubsub.schemas.attach", "topic.schema_settings.schema", required=False), admin=True),
    P + "Publish": _r(Need("pubsub.topics.publish", "topic"), publish=True),
    P + "GetTopic": _r(Need("pubsub.topics.get", "topic")),
    P + "ListTopics": _r(listing=Listing("topics", "pubsub.topics.get", response="google.pubsub.v1.ListTopicsResponse")),
    P + "ListTopicSubscriptions": _r(Need("pubsub.topics.get", "topic"), listing=Listing(
        "subscriptions", "pubsub.subscriptions.get", True, "google.pubsub.v1.ListTopicSubscriptionsResponse")),
    P + "ListTopicSnapshots": _r(Need("pubsub.topics.get", "topic"), listing=Listing(
        "snapshots", "pubsub.snapshots.get", True, "google.pubsub.v1.ListTopicSnapshotsResponse")),
    P + "DeleteTopic": _r(Need("pubsub.topics.delete", "topic"), admin=True),
    P + "DetachSubscription": _r(Need("pubsub.topics.detachSubscription", "subscription", "topic_of"), admin=True),
    # Subscriber
    S + "CreateSubscription": _r(Need("pubsub.subscriptions.create", "name", "project"),
                                 Need("pubsub.topics.attachSubscription", "topic"),
                                 Need("pubsub.topics.publish", _DLT, required=False), admin=True),
    S + "GetSubscription": _r(Need("pubsub.subscriptions.get", "subscription")),
    S + "UpdateSubscription": _r(Need("pubsub.subscriptions.update", "subscription.name"),
                                 Need("pubsub.topics.publish", "subscription." + _DLT, required=False), admin=True),
    S + "ListSubscriptions": _r(listing=Listing("subscriptions", "pubsub.subscriptions.get",
                                                response="google.pubsub.v1.ListSubscriptionsResponse")),
    S + "DeleteSubscription": _r(Need("pubsub.subscriptions.delete", "subscription"), admin=True),
    S + "ModifyAckDeadline": _r(_CONSUME),
    S + "Acknowledge": _r(_CONSUME),
    S + "Pull": _r(_CONSUME),
    S + "StreamingPull": _r(_CONSUME),  # checked at open, and again whenever policies change (api.access)
    S + "ModifyPushConfig": _r(Need("pubsub.subscriptions.update", "subscription"), admin=True),
    S + "GetSnapshot": _r(Need("pubsub.snapshots.get", "snapshot")),
    S + "ListSnapshots": _r(listing=Listing("snapshots", "pubsub.snapshots.get",
                                            response="google.pubsub.v1.ListSnapshotsResponse")),
    S + "CreateSnapshot": _r(Need("pubsub.snapshots.create", "name", "project"), _CONSUME, admin=True),
    S + "UpdateSnapshot": _r(Need("pubsub.snapshots.update", "snapshot.name"), admin=True),
    S + "DeleteSnapshot": _r(Need("pubsub.snapshots.delete", "snapshot"), admin=True),
    S + "Seek": _r(_CONSUME, Need("pubsub.snapshots.seek", "snapshot", required=False)),
    # SchemaService
    SC + "CreateSchema": _r(Need("pubsub.schemas.create", "parent", "project"), admin=True),
    SC + "GetSchema": _r(Need("pubsub.schemas.get", "name")),
    SC + "ListSchemas": _r(listing=Listing("schemas", "pubsub.schemas.get",
                                           response="google.pubsub.v1.ListSchemasResponse")),
    SC + "ListSchemaRevisions": _r(Need("pubsub.schemas.listRevisions", "name")),
    SC + "CommitSchema": _r(Need("pubsub.schemas.commit", "name"), admin=True),
    SC + "RollbackSchema": _r(Need("pubsub.schemas.rollback", "name"), admin=True),
    SC + "DeleteSchemaRevision": _r(Need("pubsub.schemas.delete", "name"), admin=True),
    SC + "DeleteSchema": _r(Need("pubsub.schemas.delete", "name"), admin=True),
    SC + "ValidateSchema": _r(Need("pubsub.schemas.validate", "parent", "project")),
    SC + "ValidateMessage": _r(Need("pubsub.schemas.validate", "parent", "project"),
                               Need("pubsub.schemas.validate", "name", required=False)),
    # IAMPolicy (TestIamPermissions needs nothing: it answers for the caller, api.admin_api)
    I + "SetIamPolicy": _r(Need("setIamPolicy", "resource", "iam"), admin=True),
    I + "GetIamPolicy": _r(Need("getIamPolicy", "resource", "iam")),
    I + "TestIamPermissions": _r(),
    # pigeon.v1.Queue: a queue worker consumes its subscription
    **{Q + m: _r(_CONSUME) for m in ("Take", "Ack", "Reschedule", "Bury", "Kick", "Update", "Peek", "Delete")},
    # pigeon.v1.Ranges: reading a topic's retained data is what attaching a subscription to it allows
    RG + "LatestOffsets": _r(Need("pubsub.topics.get", "topic")),
    RG + "ReadRange": _r(Need("pubsub.topics.attachSubscription", "topic")),
    RG + "CreateCursor": _r(Need("pubsub.subscriptions.create", "name", "project"),
                            Need("pubsub.topics.attachSubscription", "topic"), admin=True),
    RG + "GetCursor": _r(Need("pubsub.subscriptions.get", "name")),
    RG + "CommitCursor": _r(Need("pubsub.subscriptions.consume", "name")),
    # pigeon.v1.Monitoring: figures of what the caller may see; the cluster's layout to admins
    M + "ListProjects": _r(listing=Listing("projects", "pubsub.topics.list", True,
                                           "pigeon.v1.ListProjectsResponse")),
    M + "ListTopicStats": _r(listing=Listing("topics", "pubsub.topics.get",
                                             response="pigeon.v1.ListTopicStatsResponse")),
    M + "ListSubscriptionStats": _r(listing=Listing("subscriptions", "pubsub.subscriptions.get",
                                                    response="pigeon.v1.ListSubscriptionStatsResponse")),
    M + "GetClusterStatus": _r(Need("resourcemanager.projects.getIamPolicy", "", "admin")),
    # pigeon.v1.Storage: node to node only
    **{ST + m: _r(Need("", "", "node")) for m in ("Append", "Fence", "Read", "Delete", "ShardIn")},
}


def table_markdown() -> str:
    """The map as the Markdown table docs/security.md shows (a unit test keeps the two equal)."""
    rows = ["| method | needs | on |", "|---|---|---|"]
    for method, rule in RULES.items():
        if not rule.needs:
            needs = ("answered for the caller" if method.endswith("TestIamPermissions") else
                     f"— (items the caller holds `{rule.listing.permission}` on)" if rule.listing else "—")
            rows.append(f"| `{method}` | {needs} | |")
            continue
        for i, n in enumerate(rule.needs):
            what = {"node": "a node certificate", "admin": "a configured admin"}.get(n.on, "")
            perm = what or (f"`pubsub.KIND.{n.permission}`" if n.on == "iam" else f"`{n.permission}`")
            where = {"self": f"`{n.field}`", "project": f"the project of `{n.field}`",
                     "topic_of": f"the topic of `{n.field}`", "iam": f"`{n.field}`"}.get(n.on, "")
            if not n.required:
                where += " (when set)"
            extra = " · listed items filtered" if rule.listing and i == 0 else ""
            rows.append(f"| {'`' + method + '`' if i == 0 else ''} | {perm}{extra} | {where} |")
    return "\n".join(rows) + "\n"
