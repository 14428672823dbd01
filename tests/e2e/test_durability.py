"""End to end: what the server answered OK survives a crash. The server is killed with SIGKILL (no
checkpoint, no clean close) or stopped with SIGTERM, restarted on the same data directory, and the
official client checks what is delivered afterwards."""

import functools
import pytest

from e2e_helpers import topic_and_subscription, E2E_MARKS, ack, client_factory, close_clients, collect, ids_of, raw_publish, watch  # noqa: F401

pytestmark = E2E_MARKS

P = "dur-proj"


_setup = functools.partial(topic_and_subscription, project=P, ack_deadline_seconds=60)


def _restart(server_factory, client_factory, srv, pub, sub, how="kill"):
    close_clients(pub, sub)
    if how == "kill":
        srv.kill()
    else:
        assert srv.stop() == 0
    srv2 = server_factory(data_dir=srv.data_dir)
    return (srv2, *client_factory(srv2))


def _release(sub, subscription, received) -> None:
    """Nack, with the ack ids from before the restart: locks are records and survive it, so those ids work."""
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[r.ack_id for r in received], ack_deadline_seconds=0,
                            retry=None, timeout=30)


def test_acks_survive_sigkill(server_factory, client_factory):
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic, subscription = _setup(pub, sub, "acks")
    ids = []
    for b in range(4):
        ids += raw_publish(pub, topic, [{"data": f"m{b}-{i}".encode()} for i in range(10)])
    got = collect(sub, subscription, 40, do_ack=False)
    acked = ids[::2]
    unacked = ids[1::2]
    ack(sub, subscription, [got[i] for i in acked])  # answered OK: must be durable

    srv, pub, sub = _restart(server_factory, client_factory, srv, pub, sub)

    # the unacked ones are still locked (60 s), so nothing comes until they are released with their ack ids
    assert watch(sub, subscription, 0.5) == []
    _release(sub, subscription, [got[i] for i in unacked])
    # delivered-but-unacked messages come back (at-least-once); acked ones never do
    again = collect(sub, subscription, len(unacked), timeout=15)
    extra = watch(sub, subscription, 1.0, do_ack=True)
    delivered = set(again) | set(ids_of(extra))
    assert not delivered & set(acked), f"{len(delivered & set(acked))} acked messages were delivered again"
    assert delivered == set(unacked)
    for mid in unacked:
        assert again[mid].message.data == got[mid].message.data


def test_acks_survive_checkpoint_then_wal_then_sigkill(server_factory, client_factory):
    """Acks before a graceful stop (checkpointed) and acks after it (WAL only) both survive a crash."""
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic, subscription = _setup(pub, sub, "ckwal")
    ids = raw_publish(pub, topic, [{"data": f"c{i}".encode()} for i in range(30)])
    got = collect(sub, subscription, 30, do_ack=False)
    first = ids[:10]
    ack(sub, subscription, [got[i] for i in first])

    srv, pub, sub = _restart(server_factory, client_factory, srv, pub, sub, how="stop")
    _release(sub, subscription, [got[i] for i in ids[10:]])  # the locks were checkpointed with the state
    got = collect(sub, subscription, 20, do_ack=False)
    assert set(got) == set(ids[10:])
    second = ids[10:20]
    ack(sub, subscription, [got[i] for i in second])
    more = raw_publish(pub, topic, [{"data": f"n{i}".encode()} for i in range(5)])

    srv, pub, sub = _restart(server_factory, client_factory, srv, pub, sub, how="kill")
    _release(sub, subscription, [got[i] for i in ids[20:]])
    again = collect(sub, subscription, 15, timeout=15)
    extra = watch(sub, subscription, 1.0, do_ack=True)
    delivered = set(again) | set(ids_of(extra))
    assert not delivered & set(first + second), "acked messages were delivered again"
    assert delivered == set(ids[20:]) | set(more)


def test_published_messages_survive_sigkill(server_factory, client_factory):
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic, subscription = _setup(pub, sub, "pubs")
    futures = [pub.publish(topic, f"f{i}".encode(), i=str(i)) for i in range(200)]
    ids = [f.result(timeout=30) for f in futures]  # each answered only once on disk
    srv, pub, sub = _restart(server_factory, client_factory, srv, pub, sub)
    got = collect(sub, subscription, 200, timeout=20)
    assert set(got) == set(ids)
    for i, mid in enumerate(ids):
        assert got[mid].message.data == f"f{i}".encode()
        assert got[mid].message.attributes["i"] == str(i)
    # ids keep being unique after the restart
    new = raw_publish(pub, topic, [{"data": b"post"}] * 10)
    assert not set(new) & set(ids)
    assert set(collect(sub, subscription, 10)) == set(new)


def test_subscription_start_point_survives_sigkill(server_factory, client_factory):
    """A message published before the subscription existed stays undelivered after a crash and replay."""
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic = pub.topic_path(P, "start-topic")
    pub.create_topic(name=topic)
    early = raw_publish(pub, topic, [{"data": f"e{i}".encode()} for i in range(8)])
    subscription = sub.subscription_path(P, "start-sub")
    sub.create_subscription(name=subscription, topic=topic)
    late = raw_publish(pub, topic, [{"data": f"l{i}".encode()} for i in range(8)])
    srv, pub, sub = _restart(server_factory, client_factory, srv, pub, sub)
    got = collect(sub, subscription, 8)
    extra = watch(sub, subscription, 0.5, do_ack=True)
    delivered = set(got) | set(ids_of(extra))
    assert delivered == set(late)
    assert not delivered & set(early)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_seek_and_snapshot_survive_restart(server_factory, client_factory, how):
    srv = server_factory()
    pub, sub = client_factory(srv)
    topic, subscription = _setup(pub, sub, f"seek-{how}")
    ids = raw_publish(pub, topic, [{"data": f"s{i}".encode()} for i in range(6)])
    got = collect(sub, subscription, 6, do_ack=False)
    ack(sub, subscription, [got[i] for i in ids[:2]])
    snap = sub.snapshot_path(P, f"seek-{how}-snap")
    sub.create_snapshot(request={"name": snap, "subscription": subscription})
    ack(sub, subscription, [got[i] for i in ids[2:]])
    srv, pub, sub = _restart(server_factory, client_factory, srv, pub, sub, how=how)
    # everything was acked before the restart
    assert watch(sub, subscription, 0.5) == []
    sub.seek(request={"subscription": subscription, "snapshot": snap})
    replay = collect(sub, subscription, 4, timeout=10, do_ack=False)
    assert set(replay) == set(ids[2:])
    # the seek itself is durable: after a crash the replayed (still unacked) messages come back again
    srv, pub, sub = _restart(server_factory, client_factory, srv, pub, sub, how="kill")
    _release(sub, subscription, replay.values())
    again = collect(sub, subscription, 4, timeout=10)
    extra = watch(sub, subscription, 0.5, do_ack=True)
    assert set(again) | set(ids_of(extra)) == set(ids[2:])


def test_streaming_subscriber_survives_a_server_restart_on_the_same_port(server_factory, client_factory):
    """SIGTERM ends open streams with UNAVAILABLE; the client reconnects to the restarted server and keeps
    receiving, including what was published before the restart and not yet acked."""
    import threading
    import time

    from google.cloud import pubsub_v1

    srv = server_factory()
    pub, sub = client_factory(srv)
    topic, subscription = _setup(pub, sub, "reconnect")
    lock = threading.Lock()
    received: set[str] = set()

    def callback(message):
        with lock:
            received.add(message.message_id)
        message.ack()

    future = sub.subscribe(subscription, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=50))
    try:
        before = raw_publish(pub, topic, [{"data": f"b{i}".encode()} for i in range(10)])
        deadline = time.monotonic() + 15
        while not set(before) <= received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(before) <= received
        assert srv.stop() == 0
        srv2 = server_factory(data_dir=srv.data_dir, port=srv.port)
        pub2, _ = client_factory(srv2)
        # a call on the subscriber's own client: its channel, idle in gRPC's connection backoff since the refused
        # connects of the restart, connects again (the client library reopens the stream every 10 s at most and
        # fails at once while the channel has no connection; left alone it came back after 10 s, or — when the
        # restart fell badly in the backoff — not within 30 s)
        sub.get_subscription(request={"subscription": subscription}, timeout=30)
        # the high-level publisher retries UNAVAILABLE: the process-wide gRPC subchannel to this address may
        # still be backing off from the subscriber's reconnect attempts while the server was down
        after = [pub2.publish(topic, f"a{i}".encode()).result(timeout=30) for i in range(10)]
        deadline = time.monotonic() + 30
        while not set(after) <= received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(after) <= received, f"{len(set(after) & received)} of 10 received after the restart"
        assert not future.done(), "the subscriber gave up instead of reconnecting"
    finally:
        future.cancel()
        try:
            future.result(timeout=10)
        except Exception:
            pass
