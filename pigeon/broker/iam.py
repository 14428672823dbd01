"""IAM policies on Pub/Sub resources. Owns the rules: which permissions each predefined role grants (Pub/Sub's
access-control reference), how policies answer "may this principal do that" — the policy on the project and
the policy on the resource, inherited downward (a grant on the project holds on every resource in it), the
configured admins holding everything — and etags.

Pure: the caller passes the policies (resource name → google.iam.v1.Policy) and the admins; nothing here
knows who is calling or reads the clock."""

from __future__ import annotations

import crc32c

from pigeon.core.errors import InvalidArgument

_TOPIC = ["pubsub.topics.attachSubscription", "pubsub.topics.create", "pubsub.topics.delete",
          "pubsub.topics.detachSubscription", "pubsub.topics.get", "pubsub.topics.getIamPolicy",
          "pubsub.topics.list", "pubsub.topics.publish", "pubsub.topics.setIamPolicy", "pubsub.topics.update",
          "pubsub.topics.updateTag"]
_SUBSCRIPTION = ["pubsub.subscriptions.consume", "pubsub.subscriptions.create", "pubsub.subscriptions.delete",
                 "pubsub.subscriptions.get", "pubsub.subscriptions.getIamPolicy", "pubsub.subscriptions.list",
                 "pubsub.subscriptions.setIamPolicy", "pubsub.subscriptions.update"]
_SNAPSHOT = ["pubsub.snapshots.create", "pubsub.snapshots.delete", "pubsub.snapshots.get",
             "pubsub.snapshots.getIamPolicy", "pubsub.snapshots.list", "pubsub.snapshots.seek",
             "pubsub.snapshots.setIamPolicy", "pubsub.snapshots.update"]
_SCHEMA = ["pubsub.schemas.attach", "pubsub.schemas.commit", "pubsub.schemas.create", "pubsub.schemas.delete",
           "pubsub.schemas.get", "pubsub.schemas.getIamPolicy", "pubsub.schemas.list",
           "pubsub.schemas.listRevisions", "pubsub.schemas.rollback", "pubsub.schemas.setIamPolicy",
           "pubsub.schemas.validate"]
ALL = frozenset(_TOPIC + _SUBSCRIPTION + _SNAPSHOT + _SCHEMA)  # what TestIamPermissions accepts
# a project's own policy is Resource Manager's on Google; here the IAMPolicy service takes `projects/P` too
PROJECT_IAM = frozenset({"resourcemanager.projects.getIamPolicy", "resourcemanager.projects.setIamPolicy"})
_IAM = {p for p in ALL if p.endswith("IamPolicy")}
_READ = {p for p in ALL if p.rsplit(".", 1)[1] in ("get", "list", "listRevisions")} | {"pubsub.schemas.validate"}
ROLES: dict[str, frozenset[str]] = {
    "roles/pubsub.admin": ALL,
    "roles/owner": ALL | PROJECT_IAM,
    "roles/pubsub.editor": frozenset(ALL - _IAM),
    "roles/editor": frozenset(ALL - _IAM),
    "roles/pubsub.publisher": frozenset({"pubsub.topics.publish"}),
    "roles/pubsub.subscriber": frozenset({"pubsub.subscriptions.consume", "pubsub.topics.attachSubscription",
                                          "pubsub.snapshots.seek"}),
    "roles/pubsub.viewer": frozenset(_READ),
    "roles/viewer": frozenset(_READ),
}
PUBLIC = ("allUsers", "allAuthenticatedUsers")


class Policies(dict):
    """Resource name → policy, counting its changes: `version` tells a holder of decisions (an open stream's
    check) that they may be out of date."""

    version = 0

    def __setitem__(self, key, value):
        self.version += 1
        super().__setitem__(key, value)

    def pop(self, key, *default):
        self.version += 1
        return super().pop(key, *default)

    def clear(self):
        self.version += 1
        super().clear()


def project_of(resource: str) -> str:
    """`projects/P` of any resource name under it ("" when it names none)."""
    parts = resource.split("/", 2)
    return f"projects/{parts[1]}" if len(parts) >= 2 and parts[0] == "projects" and parts[1] else ""


def kind_permissions(resource: str) -> frozenset[str]:
    """The permissions that make sense on a resource of this kind (projects/p/KIND/id; a project: all)."""
    if resource.count("/") == 1:
        return ALL
    kind = resource.split("/")[2] if resource.count("/") >= 3 else ""
    return frozenset(p for p in ALL if p.split(".")[1] == kind)


def granted(policy, principal: str) -> set[str]:
    """Permissions the policy grants to `principal` (directly or through allUsers/allAuthenticatedUsers)."""
    who = {principal, "allUsers"}
    if principal != "allUsers":
        who.add("allAuthenticatedUsers")
    out: set[str] = set()
    for b in policy.bindings:
        if b.HasField("condition"):
            continue  # conditions are not evaluated: a conditional grant grants nothing (fail closed)
        if who.intersection(b.members):
            out |= ROLES.get(b.role, frozenset())
    return out


def effective(policies: dict, admins: frozenset[str], principal: str, resource: str) -> frozenset[str]:
    """Every permission `principal` holds on `resource`: the admins' all; else what the project's policy and
    the resource's own grant. A node's identity (`node:…`) holds nothing by itself: it only vouches for callers."""
    if principal in admins:
        return ALL | PROJECT_IAM
    if principal.startswith("node:"):
        return frozenset()
    out: set[str] = set()
    project = project_of(resource)
    for name in (project, resource) if project != resource else (resource,):
        policy = policies.get(name)
        if policy is not None:
            out |= granted(policy, principal)
    return frozenset(out)


def check_permissions(requested: list[str]) -> None:
    """A string that is not a Pub/Sub permission is refused, as the service refuses it."""
    for p in requested:
        if "*" in p:
            raise InvalidArgument(f"Permissions with wildcards ({p}) are not allowed.")
        if p not in ALL:
            raise InvalidArgument(f"Permission {p} is not valid for this resource.")


def test_permissions(policy, principal: str | None, resource: str, requested: list[str],
                     held: frozenset[str] | None = None) -> list[str]:
    """The subset of `requested` that the caller holds on `resource`, in the order asked. Without
    authentication (`principal` None) every permission that applies to the resource's kind; `held` is what the
    caller holds (`effective`), else the resource's own policy answers (open without one)."""
    check_permissions(requested)
    applicable = kind_permissions(resource)
    if held is not None:
        allowed = held & applicable
    else:
        allowed = applicable if principal is None or policy is None else granted(policy, principal) & applicable
    return [p for p in requested if p in allowed]


def etag(policy_bytes: bytes) -> bytes:
    return crc32c.crc32c(policy_bytes).to_bytes(4, "big")


def check_policy(policy) -> None:
    """What SetIamPolicy refuses: conditional bindings (Pigeon does not evaluate IAM conditions)."""
    if any(b.HasField("condition") for b in policy.bindings):
        raise InvalidArgument("IAM conditions are not supported on Pub/Sub resources here; remove the binding's "
                              "condition.")


def check_roles(policy) -> list[str]:
    """Roles in the policy that Pigeon does not know (they grant nothing)."""
    return sorted({b.role for b in policy.bindings if b.role not in ROLES})
