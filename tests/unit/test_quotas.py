"""Quotas: what a project may hold and what the server may hold in all. A create past one is refused with
RESOURCE_EXHAUSTED in Pub/Sub's words, changes nothing, and room comes back when something is deleted."""

from __future__ import annotations

import pytest

from pigeon.broker import commands
from pigeon.broker.resources import Subscription, Topic
from pigeon.broker.state import BrokerState, Quotas
from pigeon.core import limits
from pigeon.core.errors import ResourceExhausted
from pigeon.storage import records as R


def create(r: BrokerState, name: str) -> R.TopicPut:
    rec = commands.create_topic(r, Topic(name=name), 1)
    r.apply(rec)
    return rec


def test_defaults_are_pubsubs():
    q = Quotas()
    assert (q.topics, q.subscriptions, q.snapshots, q.schemas) == (10_000, 10_000, 5_000, 10_000)
    assert q.server == limits.resources_per_server_max


def test_a_project_at_its_quota_is_refused_in_pubsubs_words_and_nothing_changes():
    r = BrokerState()
    r.quotas = Quotas(topics=3)
    made = [create(r, f"projects/p/topics/top{i}") for i in range(3)]
    before = (dict(r.topics), r.next_uid, dict(r.census))
    with pytest.raises(ResourceExhausted) as e:
        create(r, "projects/p/topics/top3")
    assert str(e.value) == 'Your project has exceeded a limit: (type="topics-per-project", current=3, maximum=3).'
    assert (dict(r.topics), r.next_uid, dict(r.census)) == before
    create(r, "projects/other/topics/top0")  # another project has its own quota
    r.apply(R.TopicDel(made[0].uid))  # deleting makes room again
    create(r, "projects/p/topics/top3")
    assert r.census[("p", "topics")] == 3


def test_subscriptions_and_snapshots_count_against_their_own_quotas():
    r = BrokerState()
    r.quotas = Quotas(subscriptions=1, snapshots=1)
    create(r, "projects/p/topics/top")
    sub = Subscription(name="projects/p/subscriptions/sub0", topic="projects/p/topics/top")
    r.apply(commands.create_subscription(r, sub, "generated"))
    with pytest.raises(ResourceExhausted, match=r'type="subscriptions-per-project", current=1, maximum=1'):
        commands.create_subscription(r, Subscription(name="projects/p/subscriptions/sub1",
                                                                      topic="projects/p/topics/top"), "generated")
    _, snap = commands.create_snapshot(r, "projects/p/snapshots/snap-a", "projects/p/subscriptions/sub0", {}, 0.0, "g")
    r.apply(snap)
    with pytest.raises(ResourceExhausted, match=r'type="snapshots-per-project", current=1, maximum=1'):
        commands.create_snapshot(r, "projects/p/snapshots/snap-b", "projects/p/subscriptions/sub0", {}, 0.0, "g")


def test_the_server_total_holds_across_projects():
    """Projects are made up by naming them: without a total, a million of them could fill the memory."""
    r = BrokerState()
    r.quotas = Quotas(server=4)
    for i in range(4):
        create(r, f"projects/proj{i}/topics/top")
    with pytest.raises(ResourceExhausted, match=r'type="resources-per-server", current=4, maximum=4'):
        create(r, "projects/proj9/topics/top")
