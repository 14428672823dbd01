"""End to end: snapshots (create, get, list, update, delete) and Seek to a snapshot or a time, with the
official client against `pigeon serve`."""

import functools
import datetime as dt
import time

import pytest
from google.api_core import exceptions as gexc

from e2e_helpers import topic_and_subscription, E2E_MARKS, ack, collect, ids_of, now_utc, raw_publish, watch

pytestmark = E2E_MARKS

P = "snap-proj"


_setup = functools.partial(topic_and_subscription, project=P, ack_deadline_seconds=60)


def _ack_ids(sub, subscription, received_by_id, which):
    sub.acknowledge(subscription=subscription, ack_ids=[received_by_id[i].ack_id for i in which])


def test_snapshot_create_get_list_update_delete(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "crud")
    name = sub.snapshot_path(P, "crud-snap")
    before = now_utc()
    snap = sub.create_snapshot(request={"name": name, "subscription": subscription, "labels": {"v": "1"}})
    assert snap.name == name
    assert snap.topic == topic
    assert dict(snap.labels) == {"v": "1"}
    # no backlog: the snapshot lives 7 days from now
    life = snap.expire_time - before
    assert dt.timedelta(days=6, hours=23) <= life <= dt.timedelta(days=7, minutes=1), life

    got = sub.get_snapshot(snapshot=name)
    assert got.name == name and got.topic == topic and dict(got.labels) == {"v": "1"}

    with pytest.raises(gexc.AlreadyExists):
        sub.create_snapshot(request={"name": name, "subscription": subscription})

    updated = sub.update_snapshot(
        request={"snapshot": {"name": name, "labels": {"v": "2", "w": "x"}}, "update_mask": {"paths": ["labels"]}})
    assert dict(updated.labels) == {"v": "2", "w": "x"}
    assert dict(sub.get_snapshot(snapshot=name).labels) == {"v": "2", "w": "x"}
    assert sub.get_snapshot(snapshot=name).expire_time == snap.expire_time
    with pytest.raises(gexc.InvalidArgument):
        sub.update_snapshot(request={"snapshot": {"name": name, "topic": topic}, "update_mask": {"paths": ["topic"]}})

    # server-named
    unnamed = sub.create_snapshot(request={"name": "", "subscription": subscription})
    assert unnamed.name.startswith(f"projects/{P}/snapshots/") and unnamed.name != name
    assert unnamed.topic == topic

    listed = sorted(s.name for s in sub.list_snapshots(request={"project": f"projects/{P}"}))
    assert listed == sorted([name, unnamed.name])
    assert sorted(pub.list_topic_snapshots(request={"topic": topic})) == listed

    sub.delete_snapshot(snapshot=name)
    with pytest.raises(gexc.NotFound):
        sub.get_snapshot(snapshot=name)
    with pytest.raises(gexc.NotFound):
        sub.delete_snapshot(snapshot=name)
    assert [s.name for s in sub.list_snapshots(request={"project": f"projects/{P}"})] == [unnamed.name]


def test_snapshot_list_paging_and_errors(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "lsnap")
    names = [sub.snapshot_path(P, f"lsnap-{i}") for i in range(5)]
    for n in names:
        sub.create_snapshot(request={"name": n, "subscription": subscription})
    seen, token, pages = [], "", 0
    while True:
        page = next(iter(sub.list_snapshots(
            request={"project": f"projects/{P}", "page_size": 2, "page_token": token}).pages))
        pages += 1
        assert len(page.snapshots) <= 2
        seen.extend(s.name for s in page.snapshots)
        token = page.next_page_token
        if not token or pages > 10:
            break
    assert pages == 3 and sorted(seen) == sorted(names)

    with pytest.raises(gexc.NotFound):
        sub.create_snapshot(request={"name": sub.snapshot_path(P, "lsnap-x"),
                                     "subscription": sub.subscription_path(P, "missing-sub")})
    with pytest.raises(gexc.NotFound):
        sub.get_snapshot(snapshot=sub.snapshot_path(P, "missing-snap"))
    with pytest.raises(gexc.NotFound):
        sub.seek(request={"subscription": subscription, "snapshot": sub.snapshot_path(P, "missing-snap")})


def test_seek_to_snapshot_replays_what_was_unacked_at_snapshot_time(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "seeksnap")
    ids = raw_publish(pub, topic, [{"data": f"s{i}".encode()} for i in range(6)])
    got = collect(sub, subscription, 6, do_ack=False)
    _ack_ids(sub, subscription, got, ids[:3])
    snap = sub.snapshot_path(P, "seeksnap-snap")
    sub.create_snapshot(request={"name": snap, "subscription": subscription})
    _ack_ids(sub, subscription, got, ids[3:])
    # published after the snapshot and acked: the snapshot still counts it as unacked
    after = raw_publish(pub, topic, [{"data": b"after"}])
    collect(sub, subscription, 1)
    assert watch(sub, subscription, 0.3) == []

    sub.seek(request={"subscription": subscription, "snapshot": snap})
    replay = collect(sub, subscription, 4, timeout=10)
    assert set(replay) == set(ids[3:]) | set(after)
    assert [replay[i].message.data for i in ids[3:]] == [b"s3", b"s4", b"s5"]
    assert watch(sub, subscription, 0.5) == []

    # the snapshot can be used again
    sub.seek(request={"subscription": subscription, "snapshot": snap})
    assert set(collect(sub, subscription, 4, timeout=10)) == set(ids[3:]) | set(after)


def test_seek_to_snapshot_drops_outstanding_leases(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "seeklease", ack_deadline_seconds=300)
    ids = raw_publish(pub, topic, [{"data": f"l{i}".encode()} for i in range(4)])
    snap = sub.snapshot_path(P, "seeklease-snap")
    sub.create_snapshot(request={"name": snap, "subscription": subscription})
    collect(sub, subscription, 4, do_ack=False)  # leased for 300 s
    sub.seek(request={"subscription": subscription, "snapshot": snap})
    assert set(collect(sub, subscription, 4, timeout=5)) == set(ids)


def test_seek_to_past_time_with_retain_acked_replays_acked(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "seekpast", retain_acked_messages=True)
    t0 = now_utc()
    time.sleep(0.05)
    first = raw_publish(pub, topic, [{"data": f"a{i}".encode()} for i in range(3)])
    time.sleep(0.05)
    t_mid = now_utc()
    time.sleep(0.05)
    second = raw_publish(pub, topic, [{"data": f"b{i}".encode()} for i in range(3)])
    assert set(collect(sub, subscription, 6)) == set(first + second)  # all acked
    assert watch(sub, subscription, 0.3) == []

    sub.seek(request={"subscription": subscription, "time": t_mid})
    replay = collect(sub, subscription, 3, timeout=10)
    assert set(replay) == set(second)
    assert watch(sub, subscription, 0.5) == []

    sub.seek(request={"subscription": subscription, "time": t0})
    replay = collect(sub, subscription, 6, timeout=10)
    assert set(replay) == set(first + second)
    assert [replay[i].message.data for i in first] == [b"a0", b"a1", b"a2"]


def test_seek_to_past_time_without_retain_acked_redelivers_unacked_only(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "seeknoret", ack_deadline_seconds=300)
    t0 = now_utc()
    time.sleep(0.05)
    ids = raw_publish(pub, topic, [{"data": f"u{i}".encode()} for i in range(4)])
    got = collect(sub, subscription, 4, do_ack=False)
    _ack_ids(sub, subscription, got, ids[:2])
    # ids[2:] are leased for 300 s; seeking resets them to unacked
    sub.seek(request={"subscription": subscription, "time": t0})
    replay = collect(sub, subscription, 2, timeout=5)
    assert set(replay) == set(ids[2:])
    assert watch(sub, subscription, 0.5) == []


def test_seek_to_future_time_acks_everything_before(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "seekfuture")
    old = raw_publish(pub, topic, [{"data": f"o{i}".encode()} for i in range(5)])
    leased = collect(sub, subscription, 2, do_ack=False, max_messages=2)
    assert set(leased) <= set(old)
    sub.seek(request={"subscription": subscription, "time": now_utc() + dt.timedelta(hours=1)})
    assert watch(sub, subscription, 0.5) == []
    # acks of the purged messages are harmless
    ack(sub, subscription, leased.values())
    # the subscription keeps working for messages published later
    new = raw_publish(pub, topic, [{"data": b"new"}])
    assert set(collect(sub, subscription, 1)) == set(new)


def test_seek_past_does_not_replay_messages_from_before_the_subscription(clients):
    """Without topic retention a subscription retains only what was published after it was created:
    seeking it back to a time before its creation must not deliver older messages."""
    pub, sub = clients
    topic = pub.topic_path(P, "seekbefore-topic")
    pub.create_topic(name=topic)
    t0 = now_utc()
    time.sleep(0.05)
    early = raw_publish(pub, topic, [{"data": f"early{i}".encode()} for i in range(4)])
    subscription = sub.subscription_path(P, "seekbefore-sub")
    sub.create_subscription(request={"name": subscription, "topic": topic, "retain_acked_messages": True})
    late = raw_publish(pub, topic, [{"data": f"late{i}".encode()} for i in range(4)])
    assert set(collect(sub, subscription, 4)) == set(late)
    sub.seek(request={"subscription": subscription, "time": t0})
    replay = collect(sub, subscription, 4, timeout=10)
    extra = watch(sub, subscription, 0.5, do_ack=True)
    delivered = set(replay) | set(ids_of(extra))
    assert delivered & set(early) == set(), "messages published before the subscription existed were delivered"
    assert delivered == set(late)


def test_seek_to_snapshot_of_another_topic_fails(clients):
    pub, sub = clients
    t1, s1 = _setup(pub, sub, "cross-a")
    t2, s2 = _setup(pub, sub, "cross-b")
    raw_publish(pub, t1, [{"data": b"x"}])
    ids2 = raw_publish(pub, t2, [{"data": b"y"}])
    snap = sub.snapshot_path(P, "cross-snap")
    sub.create_snapshot(request={"name": snap, "subscription": s1})
    with pytest.raises((gexc.FailedPrecondition, gexc.InvalidArgument)):
        sub.seek(request={"subscription": s2, "snapshot": snap})
    # s2 is untouched
    assert set(collect(sub, s2, 1)) == set(ids2)
    assert watch(sub, s2, 0.3) == []


def test_snapshot_of_subscription_on_deleted_topic_fails(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "snapdel")
    pub.delete_topic(topic=topic)
    with pytest.raises((gexc.FailedPrecondition, gexc.InvalidArgument, gexc.NotFound)):
        sub.create_snapshot(request={"name": sub.snapshot_path(P, "snapdel-snap"), "subscription": subscription})


def test_snapshot_expire_time_counts_from_the_oldest_unacked_message(clients):
    pub, sub = clients
    topic, subscription = _setup(pub, sub, "snapexp")
    raw_publish(pub, topic, [{"data": b"old"}])
    oldest = collect(sub, subscription, 1, do_ack=False)
    published = next(iter(oldest.values())).message.publish_time
    time.sleep(1.2)
    snap = sub.create_snapshot(request={"name": sub.snapshot_path(P, "snapexp-snap"), "subscription": subscription})
    expected = published + dt.timedelta(days=7)
    assert abs(snap.expire_time - expected) < dt.timedelta(seconds=1), (snap.expire_time, expected)
    assert snap.expire_time < now_utc() + dt.timedelta(days=7) - dt.timedelta(seconds=1)


def test_seek_before_creation_with_topic_retention_replays_older_messages(clients):
    """With topic retention a subscription can seek to before its creation and see older messages."""
    pub, sub = clients
    topic = pub.topic_path(P, "topicret-topic")
    pub.create_topic(request={"name": topic, "message_retention_duration": {"seconds": 3600}})
    t0 = now_utc()
    time.sleep(0.05)
    early = raw_publish(pub, topic, [{"data": f"early{i}".encode()} for i in range(3)])
    subscription = sub.subscription_path(P, "topicret-sub")
    sub.create_subscription(name=subscription, topic=topic)
    assert sub.get_subscription(subscription=subscription).topic_message_retention_duration.total_seconds() == 3600
    late = raw_publish(pub, topic, [{"data": b"late"}])
    assert set(collect(sub, subscription, 1)) == set(late)
    sub.seek(request={"subscription": subscription, "time": t0})
    replay = collect(sub, subscription, 4, timeout=10)
    assert set(replay) == set(early + late)


def test_seek_replays_to_an_open_streaming_subscriber(clients):
    """An open StreamingPull sees the replay of a seek without reconnecting."""
    import threading

    from google.cloud import pubsub_v1

    pub, sub = clients
    topic, subscription = _setup(pub, sub, "seekstream")
    snap = sub.snapshot_path(P, "seekstream-snap")
    sub.create_snapshot(request={"name": snap, "subscription": subscription})
    ids = raw_publish(pub, topic, [{"data": f"w{i}".encode()} for i in range(5)])
    lock = threading.Lock()
    counts: dict[str, int] = {}

    def callback(message):
        with lock:
            counts[message.message_id] = counts.get(message.message_id, 0) + 1
        message.ack()

    def wait_for(pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not pred():
            time.sleep(0.05)
        return pred()

    future = sub.subscribe(subscription, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=10))
    try:
        assert wait_for(lambda: set(counts) >= set(ids), 10)
        time.sleep(0.3)  # let the client send its acks (batched every 10 ms)
        sub.seek(request={"subscription": subscription, "snapshot": snap})
        assert wait_for(lambda: all(counts.get(i, 0) >= 2 for i in ids), 15), counts
        assert not future.done()
    finally:
        future.cancel()
        try:
            future.result(timeout=10)
        except Exception:
            pass
