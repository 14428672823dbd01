"""broker.iam: what TestIamPermissions answers, and what a policy grants a principal."""

import pytest
from google.iam.v1 import policy_pb2

from pigeon.broker import iam
from pigeon.core.errors import InvalidArgument

TOPIC = "projects/p/topics/t"
SUB = "projects/p/subscriptions/s"
VIEWERS = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.viewer", members=["user:ann@x.org"])])


def test_without_authentication_every_applicable_permission_is_held_whatever_the_policy():
    asked = ["pubsub.subscriptions.consume", "pubsub.subscriptions.update", "pubsub.topics.publish"]
    for policy in (None, VIEWERS):
        assert iam.test_permissions(policy, None, SUB, asked) == asked[:2]


def test_a_policy_answers_per_principal():
    asked = ["pubsub.topics.get", "pubsub.topics.publish"]
    assert iam.test_permissions(VIEWERS, "user:ann@x.org", TOPIC, asked) == ["pubsub.topics.get"]
    assert iam.test_permissions(VIEWERS, "user:bob@x.org", TOPIC, asked) == []
    assert iam.test_permissions(None, "user:bob@x.org", TOPIC, asked) == asked  # no policy: open


@pytest.mark.parametrize("bad", ["pubsub.topics.fly", "publish", "", "pubsub.topics.*"])
def test_strings_that_are_not_permissions_are_refused(bad):
    with pytest.raises(InvalidArgument, match="not valid|wildcards"):
        iam.test_permissions(None, None, TOPIC, ["pubsub.topics.get", bad])


def test_grants_on_the_project_hold_on_everything_in_it_and_admins_hold_all():
    from pigeon.broker.iam import effective

    project = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.subscriber",
                                                             members=["user:ann@x.org"])])
    topic = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.publisher", members=["user:ann@x.org"])])
    policies = {"projects/p": project, TOPIC: topic}
    assert "pubsub.subscriptions.consume" in effective(policies, frozenset(), "user:ann@x.org", SUB)
    assert "pubsub.topics.publish" in effective(policies, frozenset(), "user:ann@x.org", TOPIC)
    assert "pubsub.topics.publish" not in effective(policies, frozenset(), "user:ann@x.org", "projects/p/topics/u")
    assert effective(policies, frozenset(), "user:ann@x.org", "projects/q/subscriptions/s") == frozenset()
    assert "pubsub.topics.delete" in effective({}, frozenset({"user:root@x.org"}), "user:root@x.org", TOPIC)
    assert effective(policies, frozenset(), "node:n1", SUB) == frozenset()  # a node vouches, it holds nothing


def test_a_conditional_binding_grants_nothing_and_is_refused():
    from google.type import expr_pb2

    from pigeon.broker.iam import check_policy, granted

    p = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.admin", members=["user:ann@x.org"],
                                                       condition=expr_pb2.Expr(expression="request.time < x"))])
    assert granted(p, "user:ann@x.org") == set()
    with pytest.raises(InvalidArgument, match="conditions"):
        check_policy(p)
