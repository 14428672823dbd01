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
