"""IAM policy operations of the engine (google.iam.v1.IAMPolicy): the rules themselves are broker.iam's. A
project (`projects/P`) takes a policy too: its grants hold on everything in the project."""

from __future__ import annotations

from pigeon.broker import iam, resources
from pigeon.storage import records as R
from pigeon.core import names
from pigeon.core.errors import Aborted, InvalidArgument


class IamOps:
    def __init__(self, engine):
        self.engine = engine

    def _resource(self, resource: str) -> None:
        parts = resource.split("/")
        if len(parts) == 2 and parts[0] == "projects":
            names.project_of(resource)  # a project is only a name: any valid one takes a policy
            return
        kind = parts[2] if len(parts) == 4 else ""
        lookup = {"topics": self.engine.state.topic, "subscriptions": self.engine.state.sub,
                  "snapshots": self.engine.state.snapshot, "schemas": self.engine.state.schema}.get(kind)
        if lookup is None:
            raise InvalidArgument(f"Invalid resource name ({resource}): expected a topic, subscription, snapshot "
                                  "or schema.")
        lookup(resource)

    def get_policy(self, resource: str):
        self._resource(resource)
        policy = self.engine.state.policies.get(resource)
        out = resources.Policy()
        if policy is not None:
            out.CopyFrom(policy)
        else:
            out.etag = iam.etag(b"")
        return out

    async def set_policy(self, resource: str, policy):
        self.engine.check_open()
        self._resource(resource)
        current = self.get_policy(resource)
        if policy.etag and policy.etag != current.etag:
            raise Aborted("The policy was changed since it was read (etag mismatch); read it again.")
        iam.check_policy(policy)
        unknown = iam.check_roles(policy)
        if unknown:
            raise InvalidArgument(f"Unknown role(s) for Pub/Sub resources: {', '.join(unknown)}.")
        stored = resources.Policy()
        stored.CopyFrom(policy)
        stored.ClearField("etag")
        stored.etag = iam.etag(stored.SerializeToString(deterministic=True))
        await self.engine.change(R.PolicyPut(resource, stored.SerializeToString(deterministic=True)))
        return stored

    def test_permissions(self, resource: str, permissions: list[str], principal: str | None,
                         admins: frozenset[str] = frozenset()) -> list[str]:
        """What the caller holds of `permissions` on `resource`. Without authentication (`principal` None)
        everything that applies; else what its grants say — and a caller holding nothing there learns nothing,
        not even whether the resource exists."""
        if principal is None:
            self._resource(resource)
            return iam.test_permissions(self.engine.state.policies.get(resource), None, resource, permissions)
        iam.check_permissions(permissions)
        held = iam.effective(self.engine.state.policies, admins, principal, resource)
        if not held & iam.kind_permissions(resource):
            return []
        self._resource(resource)
        return iam.test_permissions(None, principal, resource, permissions, held)
