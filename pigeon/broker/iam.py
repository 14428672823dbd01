"""IAM policies on Pub/Sub resources. Owns the rules: which permissions each predefined role grants, how a
policy answers "may this principal do that" (the check that authentication will plug into), and etags.

Until authentication exists the caller is nobody in particular (principal None) and may do everything: policies
are stored and returned, and `granted` answers for a principal, but nothing enforces them yet."""

from __future__ import annotations

import crc32c

from pigeon.core.errors import InvalidArgument

_TOPIC = ["pubsub.topics.attachSubscription", "pubsub.topics.delete", "pubsub.topics.detachSubscription",
          "pubsub.topics.get", "pubsub.topics.getIamPolicy", "pubsub.topics.publish", "pubsub.topics.setIamPolicy",
          "pubsub.topics.update", "pubsub.topics.updateTag"]
_SUBSCRIPTION = ["pubsub.subscriptions.consume", "pubsub.subscriptions.delete", "pubsub.subscriptions.get",
                 "pubsub.subscriptions.getIamPolicy", "pubsub.subscriptions.setIamPolicy",
                 "pubsub.subscriptions.update"]
_SNAPSHOT = ["pubsub.snapshots.delete", "pubsub.snapshots.get", "pubsub.snapshots.getIamPolicy",
             "pubsub.snapshots.seek", "pubsub.snapshots.setIamPolicy", "pubsub.snapshots.update"]
_SCHEMA = ["pubsub.schemas.attach", "pubsub.schemas.commit", "pubsub.schemas.delete", "pubsub.schemas.get",
           "pubsub.schemas.getIamPolicy", "pubsub.schemas.setIamPolicy", "pubsub.schemas.validate"]
ALL = frozenset(_TOPIC + _SUBSCRIPTION + _SNAPSHOT + _SCHEMA)

_READ = {p for p in ALL if p.endswith(".get")}
ROLES: dict[str, frozenset[str]] = {
    "roles/pubsub.admin": ALL,
    "roles/owner": ALL,
    "roles/pubsub.editor": frozenset(p for p in ALL if not p.endswith("IamPolicy")),
    "roles/editor": frozenset(p for p in ALL if not p.endswith("IamPolicy")),
    "roles/pubsub.publisher": frozenset({"pubsub.topics.publish"}),
    "roles/pubsub.subscriber": frozenset({"pubsub.subscriptions.consume", "pubsub.topics.attachSubscription",
                                          "pubsub.snapshots.seek"}),
    "roles/pubsub.viewer": frozenset(_READ),
    "roles/viewer": frozenset(_READ),
}
PUBLIC = ("allUsers", "allAuthenticatedUsers")


def kind_permissions(resource: str) -> frozenset[str]:
    """The permissions that make sense on a resource of this kind (projects/p/KIND/id)."""
    kind = resource.split("/")[2] if resource.count("/") >= 3 else ""
    return frozenset(p for p in ALL if p.split(".")[1] == kind)


def granted(policy, principal: str) -> set[str]:
    """Permissions the policy grants to `principal` (directly or through allUsers/allAuthenticatedUsers)."""
    who = {principal, "allUsers"}
    if principal != "allUsers":
        who.add("allAuthenticatedUsers")
    out: set[str] = set()
    for b in policy.bindings:
        if who.intersection(b.members):
            out |= ROLES.get(b.role, frozenset())
    return out


def test_permissions(policy, principal: str | None, resource: str, requested: list[str]) -> list[str]:
    """The subset of `requested` that the caller holds on `resource`, in the order asked. `principal` None (no
    authentication): every permission that applies to the resource's kind; without a policy: the same (open).
    A string that is not a Pub/Sub permission is refused, as the service refuses it."""
    for p in requested:
        if "*" in p:
            raise InvalidArgument(f"Permissions with wildcards ({p}) are not allowed.")
        if p not in ALL:
            raise InvalidArgument(f"Permission {p} is not valid for this resource.")
    applicable = kind_permissions(resource)
    allowed = applicable if principal is None or policy is None else granted(policy, principal) & applicable
    return [p for p in requested if p in allowed]


def etag(policy_bytes: bytes) -> bytes:
    return crc32c.crc32c(policy_bytes).to_bytes(4, "big")


def check_roles(policy) -> list[str]:
    """Roles in the policy that Pigeon does not know (they grant nothing)."""
    return sorted({b.role for b in policy.bindings if b.role not in ROLES})
