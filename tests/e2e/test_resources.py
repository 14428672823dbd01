"""End to end: topic and subscription resources through the official client against `pigeon serve`."""

import pytest
from google.api_core import exceptions as gexc

from e2e_helpers import E2E_MARKS, client_factory, collect, pull_now, raw_publish  # noqa: F401  (fixture)

pytestmark = E2E_MARKS

P = "res-proj"


def _topic(pub, name):
    return pub.topic_path(P, name)


def _sub(sub, name):
    return sub.subscription_path(P, name)


# ------------------------------------------------------------------------------------------- topics
def test_topic_create_get_labels_round_trip(clients):
    pub, _ = clients
    name = _topic(pub, "rt-topic")
    created = pub.create_topic(request={"name": name, "labels": {"team": "core", "env": "dev-1"}})
    assert created.name == name
    assert dict(created.labels) == {"team": "core", "env": "dev-1"}
    got = pub.get_topic(topic=name)
    assert got.name == name
    assert dict(got.labels) == {"team": "core", "env": "dev-1"}


def test_topic_duplicate_create_is_already_exists(clients):
    pub, _ = clients
    name = _topic(pub, "dup-topic")
    pub.create_topic(name=name)
    with pytest.raises(gexc.AlreadyExists):
        pub.create_topic(name=name)


def test_missing_topic_operations_are_not_found(clients):
    pub, sub = clients
    missing = _topic(pub, "no-such-topic")
    with pytest.raises(gexc.NotFound):
        pub.get_topic(topic=missing)
    with pytest.raises(gexc.NotFound):
        pub.delete_topic(topic=missing)
    with pytest.raises(gexc.NotFound):
        pub.list_topic_subscriptions(request={"topic": missing})
    with pytest.raises(gexc.NotFound):
        sub.create_subscription(name=_sub(sub, "orphan-sub"), topic=missing)
    with pytest.raises(gexc.NotFound):
        pub.update_topic(
            request={"topic": {"name": missing, "labels": {"a": "b"}}, "update_mask": {"paths": ["labels"]}}
        )


def test_topic_update_with_field_mask(clients):
    pub, _ = clients
    name = _topic(pub, "upd-topic")
    pub.create_topic(request={"name": name, "labels": {"keep": "me"}})
    updated = pub.update_topic(
        request={
            "topic": {"name": name, "labels": {"new": "label"}, "message_retention_duration": {"seconds": 3600}},
            "update_mask": {"paths": ["labels"]},
        }
    )
    assert dict(updated.labels) == {"new": "label"}
    # only the masked field changed
    assert updated.message_retention_duration.total_seconds() == 0
    got = pub.get_topic(topic=name)
    assert dict(got.labels) == {"new": "label"}

    updated = pub.update_topic(
        request={
            "topic": {"name": name, "message_retention_duration": {"seconds": 3600}},
            "update_mask": {"paths": ["message_retention_duration"]},
        }
    )
    assert updated.message_retention_duration.total_seconds() == 3600
    assert dict(updated.labels) == {"new": "label"}
    assert pub.get_topic(topic=name).message_retention_duration.total_seconds() == 3600


def test_topic_update_immutable_or_unknown_field_is_invalid(clients):
    pub, _ = clients
    name = _topic(pub, "imm-topic")
    pub.create_topic(name=name)
    with pytest.raises(gexc.InvalidArgument):
        pub.update_topic(request={"topic": {"name": name}, "update_mask": {"paths": ["name"]}})
    with pytest.raises(gexc.InvalidArgument):
        pub.update_topic(request={"topic": {"name": name, "labels": {"a": "b"}}, "update_mask": {"paths": []}})
    assert pub.get_topic(topic=name).name == name


def test_list_topics_paging(clients):
    pub, _ = clients
    names = [_topic(pub, f"page-topic-{i}") for i in range(5)]
    for n in names:
        pub.create_topic(name=n)
    seen, tokens, pages = [], [], 0
    token = ""
    while True:
        resp = pub.list_topics(request={"project": f"projects/{P}", "page_size": 2, "page_token": token}).pages
        page = next(iter(resp))
        pages += 1
        assert len(page.topics) <= 2
        seen.extend(t.name for t in page.topics)
        token = page.next_page_token
        if not token:
            break
        tokens.append(token)
        assert pages < 10
    assert pages == 3
    assert sorted(seen) == sorted(names)
    assert len(seen) == len(set(seen))
    # the pager of the high-level call follows tokens itself
    assert sorted(t.name for t in pub.list_topics(request={"project": f"projects/{P}", "page_size": 2})) == sorted(names)
    # another project is separate
    assert list(pub.list_topics(request={"project": "projects/other-proj"})) == []


def test_delete_topic_keeps_subscriptions_on_deleted_topic(clients):
    pub, sub = clients
    topic = _topic(pub, "del-topic")
    s1 = _sub(sub, "del-topic-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=s1, topic=topic)
    pub.delete_topic(topic=topic)
    with pytest.raises(gexc.NotFound):
        pub.get_topic(topic=topic)
    got = sub.get_subscription(subscription=s1)
    assert got.topic == "_deleted-topic_"
    listed = {s.name: s.topic for s in sub.list_subscriptions(request={"project": f"projects/{P}"})}
    assert listed[s1] == "_deleted-topic_"
    # the name is free again; the old subscription is not attached to the new topic
    pub.create_topic(name=topic)
    assert list(pub.list_topic_subscriptions(request={"topic": topic})) == []
    assert sub.get_subscription(subscription=s1).topic == "_deleted-topic_"


# ------------------------------------------------------------------------------------ subscriptions
def test_subscription_create_get_defaults_and_labels(clients):
    pub, sub = clients
    topic = _topic(pub, "sub-defaults-topic")
    pub.create_topic(name=topic)
    name = _sub(sub, "sub-defaults")
    created = sub.create_subscription(request={"name": name, "topic": topic, "labels": {"owner": "qa"}})
    assert created.name == name and created.topic == topic
    got = sub.get_subscription(subscription=name)
    assert got.topic == topic
    assert got.ack_deadline_seconds == 10  # 0 means the default, 10 s
    assert got.message_retention_duration.total_seconds() == 7 * 86400
    assert dict(got.labels) == {"owner": "qa"}
    assert got.expiration_policy.ttl.total_seconds() == 31 * 86400  # the documented default

    custom = sub.create_subscription(
        request={
            "name": _sub(sub, "sub-custom"),
            "topic": topic,
            "ack_deadline_seconds": 600,
            "retain_acked_messages": True,
            "message_retention_duration": {"seconds": 600},
        }
    )
    assert custom.ack_deadline_seconds == 600
    assert custom.retain_acked_messages is True
    assert custom.message_retention_duration.total_seconds() == 600


def test_pull_subscription_has_an_empty_push_config_in_every_answer(clients):
    """Google's service answers pushConfig {} for a pull subscription (clients read pushConfig.pushEndpoint)."""
    from google.pubsub_v1 import types

    def present(s):
        return types.Subscription.pb(s).HasField("push_config")

    pub, sub = clients
    topic = _topic(pub, "push-cfg-topic")
    pub.create_topic(name=topic)
    name = _sub(sub, "push-cfg-sub")
    assert present(sub.create_subscription(name=name, topic=topic))
    assert present(sub.get_subscription(subscription=name))
    assert all(present(s) for s in sub.list_subscriptions(request={"project": f"projects/{P}"}))
    updated = sub.update_subscription(request={"subscription": {"name": name, "push_config": {}},
                                               "update_mask": {"paths": ["push_config"]}})
    assert present(updated) and updated.push_config.push_endpoint == ""
    assert present(sub.update_subscription(request={"subscription": {"name": name, "ack_deadline_seconds": 30},
                                                    "update_mask": {"paths": ["ack_deadline_seconds"]}}))


def test_server_named_subscription(clients):
    pub, sub = clients
    topic = _topic(pub, "srv-named-topic")
    pub.create_topic(name=topic)
    created = sub.create_subscription(request={"name": "", "topic": topic})
    assert created.name.startswith(f"projects/{P}/subscriptions/")
    assert sub.get_subscription(subscription=created.name).topic == topic


def test_subscription_duplicate_and_missing(clients):
    pub, sub = clients
    topic = _topic(pub, "sub-dup-topic")
    pub.create_topic(name=topic)
    name = _sub(sub, "sub-dup")
    sub.create_subscription(name=name, topic=topic)
    with pytest.raises(gexc.AlreadyExists):
        sub.create_subscription(name=name, topic=topic)
    missing = _sub(sub, "sub-missing")
    with pytest.raises(gexc.NotFound):
        sub.get_subscription(subscription=missing)
    with pytest.raises(gexc.NotFound):
        sub.delete_subscription(subscription=missing)
    with pytest.raises(gexc.NotFound):
        sub.pull(subscription=missing, max_messages=1, return_immediately=True, timeout=10)
    with pytest.raises(gexc.NotFound):
        sub.acknowledge(subscription=missing, ack_ids=["1.2.3"])


def test_delete_subscription_then_pull_is_not_found(clients):
    pub, sub = clients
    topic = _topic(pub, "sub-del-topic")
    pub.create_topic(name=topic)
    name = _sub(sub, "sub-del")
    sub.create_subscription(name=name, topic=topic)
    raw_publish(pub, topic, [{"data": b"x"}])
    sub.delete_subscription(subscription=name)
    with pytest.raises(gexc.NotFound):
        sub.get_subscription(subscription=name)
    with pytest.raises(gexc.NotFound):
        sub.pull(subscription=name, max_messages=1, return_immediately=True, timeout=10)
    assert list(pub.list_topic_subscriptions(request={"topic": topic})) == []
    # re-creating the name gives a fresh subscription without the old backlog
    sub.create_subscription(name=name, topic=topic)
    assert pull_now(sub, name) == []


def test_subscription_update_with_field_mask(clients):
    pub, sub = clients
    topic = _topic(pub, "sub-upd-topic")
    pub.create_topic(name=topic)
    name = _sub(sub, "sub-upd")
    sub.create_subscription(request={"name": name, "topic": topic, "labels": {"a": "1"}})
    updated = sub.update_subscription(
        request={
            "subscription": {"name": name, "ack_deadline_seconds": 45, "labels": {"b": "2"}},
            "update_mask": {"paths": ["ack_deadline_seconds"]},
        }
    )
    assert updated.ack_deadline_seconds == 45
    assert dict(updated.labels) == {"a": "1"}  # not in the mask
    updated = sub.update_subscription(
        request={
            "subscription": {"name": name, "labels": {"b": "2"}, "retain_acked_messages": True},
            "update_mask": {"paths": ["labels", "retain_acked_messages"]},
        }
    )
    assert dict(updated.labels) == {"b": "2"}
    assert updated.retain_acked_messages is True
    got = sub.get_subscription(subscription=name)
    assert got.ack_deadline_seconds == 45 and dict(got.labels) == {"b": "2"} and got.retain_acked_messages
    assert got.topic == topic


def test_subscription_update_immutable_field_is_invalid(clients):
    pub, sub = clients
    topic = _topic(pub, "sub-imm-topic")
    other = _topic(pub, "sub-imm-other")
    pub.create_topic(name=topic)
    pub.create_topic(name=other)
    name = _sub(sub, "sub-imm")
    sub.create_subscription(name=name, topic=topic)
    with pytest.raises(gexc.InvalidArgument):
        sub.update_subscription(
            request={"subscription": {"name": name, "topic": other}, "update_mask": {"paths": ["topic"]}}
        )
    with pytest.raises(gexc.InvalidArgument):
        sub.update_subscription(
            request={
                "subscription": {"name": name, "enable_message_ordering": True},
                "update_mask": {"paths": ["enable_message_ordering"]},
            }
        )
    with pytest.raises(gexc.InvalidArgument):
        sub.update_subscription(
            request={
                "subscription": {"name": name, "ack_deadline_seconds": 700},
                "update_mask": {"paths": ["ack_deadline_seconds"]},
            }
        )
    got = sub.get_subscription(subscription=name)
    assert got.topic == topic and got.ack_deadline_seconds == 10 and not got.enable_message_ordering


def test_list_subscriptions_and_topic_subscriptions_paging(clients):
    pub, sub = clients
    t1, t2 = _topic(pub, "lsub-topic-1"), _topic(pub, "lsub-topic-2")
    pub.create_topic(name=t1)
    pub.create_topic(name=t2)
    on_t1 = [_sub(sub, f"lsub-a-{i}") for i in range(5)]
    on_t2 = [_sub(sub, "lsub-b-0")]
    for n in on_t1:
        sub.create_subscription(name=n, topic=t1)
    sub.create_subscription(name=on_t2[0], topic=t2)

    # ListSubscriptions: 6 items with page_size 2 → 3 pages, token-driven
    seen, token, pages = [], "", 0
    while True:
        page = next(iter(sub.list_subscriptions(
            request={"project": f"projects/{P}", "page_size": 2, "page_token": token}).pages))
        pages += 1
        assert len(page.subscriptions) <= 2
        seen.extend(s.name for s in page.subscriptions)
        token = page.next_page_token
        if not token or pages > 10:
            break
    assert pages == 3
    assert sorted(seen) == sorted(on_t1 + on_t2)

    # ListTopicSubscriptions: 5 names with page_size 2 → 3 pages
    seen, token, pages = [], "", 0
    while True:
        page = next(iter(pub.list_topic_subscriptions(
            request={"topic": t1, "page_size": 2, "page_token": token}).pages))
        pages += 1
        assert len(page.subscriptions) <= 2
        seen.extend(page.subscriptions)
        token = page.next_page_token
        if not token or pages > 10:
            break
    assert pages == 3
    assert sorted(seen) == sorted(on_t1)
    assert list(pub.list_topic_subscriptions(request={"topic": t2})) == on_t2


# ---------------------------------------------------------------------------------- validation
INVALID_IDS = [
    ("ab", "3"),  # too short: the message names the 3..255 length rule
    ("x" * 256, "255"),  # too long
    ("goog-res", "goog"),  # reserved prefix
    ("googres", "goog"),
    ("bad name!", "letter"),  # bad characters: the message names the allowed characters
    ("1starts-with-digit", "letter"),
    ("has*star", "letter"),
]


def test_invalid_topic_names(clients):
    pub, _ = clients
    for resource_id, rule in INVALID_IDS:
        with pytest.raises(gexc.InvalidArgument) as ei:
            pub.create_topic(name=f"projects/{P}/topics/{resource_id}")
        assert rule in ei.value.message, (resource_id, ei.value.message)
    assert list(pub.list_topics(request={"project": f"projects/{P}"})) == []


def test_valid_name_edge_cases_are_accepted(clients):
    pub, sub = clients
    for rid in ["abc", "a" * 255, "A-b_c.d~e+f%g"]:
        name = f"projects/{P}/topics/{rid}"
        assert pub.create_topic(name=name).name == name
        assert pub.get_topic(topic=name).name == name


def test_invalid_subscription_and_snapshot_names(clients):
    pub, sub = clients
    topic = _topic(pub, "badsub-topic")
    pub.create_topic(name=topic)
    good = _sub(sub, "badsub-good")
    sub.create_subscription(name=good, topic=topic)
    for resource_id, rule in INVALID_IDS + [("bad/name", "projects/")]:
        with pytest.raises(gexc.InvalidArgument) as ei:
            sub.create_subscription(name=f"projects/{P}/subscriptions/{resource_id}", topic=topic)
        assert rule in ei.value.message, (resource_id, ei.value.message)
        with pytest.raises(gexc.InvalidArgument) as ei:
            sub.create_snapshot(request={"name": f"projects/{P}/snapshots/{resource_id}", "subscription": good})
        assert rule in ei.value.message, (resource_id, ei.value.message)
    assert [s.name for s in sub.list_subscriptions(request={"project": f"projects/{P}"})] == [good]


def test_ack_deadline_out_of_range(clients):
    pub, sub = clients
    topic = _topic(pub, "ackdl-topic")
    pub.create_topic(name=topic)
    for deadline in [1, 9, 601, 3600]:
        name = _sub(sub, f"ackdl-sub-{deadline}")
        with pytest.raises(gexc.InvalidArgument) as ei:
            sub.create_subscription(request={"name": name, "topic": topic, "ack_deadline_seconds": deadline})
        assert "10" in ei.value.message and "600" in ei.value.message, ei.value.message
        with pytest.raises(gexc.NotFound):
            sub.get_subscription(subscription=name)
    for deadline in [10, 600]:  # the bounds themselves are fine
        created = sub.create_subscription(
            request={"name": _sub(sub, f"ackdl-sub-{deadline}"), "topic": topic, "ack_deadline_seconds": deadline})
        assert created.ack_deadline_seconds == deadline


def test_retention_out_of_range(clients):
    pub, sub = clients
    topic = _topic(pub, "ret-topic")
    pub.create_topic(name=topic)
    ok = _sub(sub, "ret-sub-ok")
    sub.create_subscription(name=ok, topic=topic)
    for seconds in [599, 31 * 86400 + 1]:
        with pytest.raises(gexc.InvalidArgument) as ei:
            sub.create_subscription(
                request={"name": _sub(sub, "ret-sub"), "topic": topic,
                         "message_retention_duration": {"seconds": seconds}})
        assert "retention" in ei.value.message, ei.value.message
        with pytest.raises(gexc.InvalidArgument):
            pub.create_topic(request={"name": _topic(pub, "ret-topic-2"),
                                      "message_retention_duration": {"seconds": seconds}})
        with pytest.raises(gexc.InvalidArgument):
            sub.update_subscription(
                request={"subscription": {"name": ok, "message_retention_duration": {"seconds": seconds}},
                         "update_mask": {"paths": ["message_retention_duration"]}})
    assert sub.get_subscription(subscription=ok).message_retention_duration.total_seconds() == 7 * 86400
    for seconds in [600, 31 * 86400]:  # the bounds themselves are fine
        created = sub.create_subscription(
            request={"name": _sub(sub, f"ret-sub-{seconds}"), "topic": topic,
                     "message_retention_duration": {"seconds": seconds}})
        assert created.message_retention_duration.total_seconds() == seconds


def test_invalid_labels_are_rejected(clients):
    pub, _ = clients
    with pytest.raises(gexc.InvalidArgument):
        pub.create_topic(request={"name": _topic(pub, "lbl-topic"), "labels": {"UPPER": "x"}})
    with pytest.raises(gexc.InvalidArgument):
        pub.create_topic(request={"name": _topic(pub, "lbl-topic"), "labels": {"ok": "Not Valid"}})
    with pytest.raises(gexc.NotFound):
        pub.get_topic(topic=_topic(pub, "lbl-topic"))


# ------------------------------------------------------------------------------------ restarts
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_configuration_survives_restart(server_factory, client_factory, how):
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic = _topic(pub, "persist-topic")
    gone_topic = _topic(pub, "persist-gone-topic")
    pub.create_topic(request={"name": topic, "labels": {"k": "v"},
                              "message_retention_duration": {"seconds": 7200}})
    pub.create_topic(name=gone_topic)
    s1 = _sub(sub, "persist-sub")
    s_orphan = _sub(sub, "persist-orphan")
    s_deleted = _sub(sub, "persist-deleted")
    sub.create_subscription(request={"name": s1, "topic": topic, "ack_deadline_seconds": 42,
                                     "labels": {"x": "y"}, "retain_acked_messages": True,
                                     "message_retention_duration": {"seconds": 86400}})
    sub.create_subscription(name=s_orphan, topic=gone_topic)
    sub.create_subscription(name=s_deleted, topic=topic)
    sub.update_subscription(request={"subscription": {"name": s1, "labels": {"x": "z"}},
                                     "update_mask": {"paths": ["labels"]}})
    pub.delete_topic(topic=gone_topic)
    sub.delete_subscription(subscription=s_deleted)
    snap = sub.snapshot_path(P, "persist-snap")
    sub.create_snapshot(request={"name": snap, "subscription": s1, "labels": {"s": "1"}})

    if how == "stop":
        assert srv.stop() == 0
    else:
        srv.kill()
    srv2 = server_factory(data_dir=srv.data_dir)
    pub, sub = client_factory(srv2)

    t = pub.get_topic(topic=topic)
    assert dict(t.labels) == {"k": "v"}
    assert t.message_retention_duration.total_seconds() == 7200
    with pytest.raises(gexc.NotFound):
        pub.get_topic(topic=gone_topic)
    s = sub.get_subscription(subscription=s1)
    assert s.topic == topic
    assert s.ack_deadline_seconds == 42
    assert dict(s.labels) == {"x": "z"}
    assert s.retain_acked_messages is True
    assert s.message_retention_duration.total_seconds() == 86400
    assert sub.get_subscription(subscription=s_orphan).topic == "_deleted-topic_"
    with pytest.raises(gexc.NotFound):
        sub.get_subscription(subscription=s_deleted)
    assert list(pub.list_topic_subscriptions(request={"topic": topic})) == [s1]
    sn = sub.get_snapshot(snapshot=snap)
    assert sn.topic == topic and dict(sn.labels) == {"s": "1"}
    # still usable: a duplicate create is refused, publishing and pulling work
    with pytest.raises(gexc.AlreadyExists):
        pub.create_topic(name=topic)
    mid = raw_publish(pub, topic, [{"data": b"after-restart"}])[0]
    got = collect(sub, s1, 1)
    assert list(got) == [mid]
    assert got[mid].message.data == b"after-restart"
