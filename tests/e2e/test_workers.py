"""`pigeon serve --workers 2` as a user runs it: one real supervisor process, its two workers and its etcd, driven
through the one port by the official clients. Topics whose bundles each worker owns are published to and
streamed from through that port (a call reaching the other worker is forwarded); a worker killed with SIGKILL is
started again by the supervisor and nothing acknowledged is lost; the supervisor refuses data directories of the
other kind; stopping the supervisor stops everything it started."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from pigeon.testing.cluster import (await_status, clients_of, node_process, open_ledgers, owners, status,
                                    topic_owned_by, wipe)
from pigeon.testing.server import ServerProcess

pytestmark = pytest.mark.e2e

P = "projects/workers"


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def _worker_pids(supervisor: int) -> dict[str, int]:
    """node id → pid of the supervisor's running workers (their settings come in the environment)."""
    out = {}
    for pid in _children(supervisor):
        if "pigeon serve" in _cmdline(pid):
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            out[env[b"PIGEON_NODE_ID"].decode()] = pid
    return out


def _streamed(sub, subscription: str, want: set[str], timeout: float = 60.0) -> dict[str, str]:
    """Stream (StreamingPull through the shared port), acking, until every id in `want` came: id → data."""
    got: dict[str, str] = {}
    done = threading.Event()

    def on_message(m):
        got[m.message_id] = m.data.decode()
        m.ack()
        if want <= got.keys():
            done.set()

    future = sub.subscribe(subscription, on_message)
    done.wait(timeout)
    future.cancel()
    future.result(timeout=30)
    return got


@pytest.fixture
def workers(tmp_path):
    server = ServerProcess(str(tmp_path / "data"), extra=["--workers", "2"], http=True)
    server.start(timeout=60)
    with open(tmp_path / "data" / "workers.json") as f:
        etcd = f"127.0.0.1:{json.load(f)['etcd_client']}"
    await_status(etcd, lambda st: st["unowned"] == 0 and sum(r["state"] == "up" and r["bundles"] > 0 for r in st["nodes"]) == 2
                 and st["ledgers"]["open"] >= st["bundles"], timeout=60, what="both workers to own their bundles")
    yield server, etcd
    server.stop(timeout=60)


def test_two_workers_serve_one_port_and_a_killed_worker_loses_nothing(workers):
    server, etcd = workers
    owner_of = owners(etcd)
    assert set(owner_of.values()) == {"w0", "w1"}, owner_of
    topics = {w: topic_owned_by(owner_of, w, f"{P}/topics/t-{w}") for w in ("w0", "w1")}
    pub, sub = clients_of(server)
    subs = {}
    for w, topic in topics.items():
        pub.create_topic(name=topic)
        subs[w] = f"{P}/subscriptions/s-{w}"
        sub.create_subscription(name=subs[w], topic=topic, ack_deadline_seconds=10)

    sent = {w: {pub.publish(t, f"{w}-a{i}".encode()).result(timeout=30): f"{w}-a{i}" for i in range(200)}
            for w, t in topics.items()}
    for w in topics:  # each worker's topic, streamed through the port both share
        got = _streamed(sub, subs[w], set(sent[w]))
        assert got.items() >= sent[w].items(), f"{len(set(sent[w]) - set(got))} of {w}'s messages not delivered"

    pids = _worker_pids(server.proc.pid)
    assert set(pids) == {"w0", "w1"}
    os.kill(pids["w0"], signal.SIGKILL)
    after = {}
    deadline = time.monotonic() + 90
    for w, t in topics.items():  # answered again once the supervisor restarted w0 (or w1 took its bundles)
        for i in range(100):
            while True:
                try:
                    after.setdefault(w, {})[pub.publish(t, f"{w}-b{i}".encode()).result(timeout=30)] = f"{w}-b{i}"
                    break
                except Exception:  # noqa: BLE001 — UNAVAILABLE while the bundle's owner comes back: publish again
                    assert time.monotonic() < deadline, "publishing did not resume"
                    time.sleep(0.2)
    for w in topics:
        got = _streamed(sub, subs[w], set(after[w]))
        assert got.items() >= after[w].items(), f"{len(set(after[w]) - set(got))} acknowledged publishes lost"
        assert not set(got) & set(sent[w]), "a message acknowledged before the kill came back"
    restarted = _worker_pids(server.proc.pid)
    assert set(restarted) == {"w0", "w1"} and restarted["w0"] != pids["w0"], "the supervisor started w0 again"
    with open(server.log_path, errors="replace") as f:
        text = f.read()
    assert "worker 0 (pid" in text and "exited with -9: starting it again" in text
    assert all(f"INFO [{w}] pigeon.server: pigeon serving on" in text for w in ("w0", "w1")), "each line says whose"
    pub.stop()
    sub.close()


def _get(url: str, timeout: float = 30.0) -> str:
    """GET, waiting for the port to listen (a worker opens its HTTP ports after gRPC)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.read().decode()
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_each_worker_is_scraped_on_a_port_of_its_own_beside_the_shared_one(workers, tmp_path):
    server, _ = workers
    with open(tmp_path / "data" / "workers.json") as f:
        own = json.load(f)["worker_http_ports"]
    assert len(own) == 2 and len(set(own)) == 2
    owned = []
    for port in own:  # each port is one worker's: together they speak for every bundle once
        text = _get(f"http://127.0.0.1:{port}/metrics")
        owned.append(float(re.search(r"^pigeon_cluster_bundles_owned (\S+)$", text, re.M).group(1)))
    assert all(n > 0 for n in owned) and sum(owned) == 16, owned
    assert "pigeon_cluster_bundles_owned" in _get(f"{server.http}/metrics")  # the shared port: one of them


def test_stopping_the_supervisor_stops_its_workers_and_etcd(workers):
    server, _ = workers
    started = _children(server.proc.pid)
    assert len(started) == 3  # two workers and etcd
    assert server.stop(timeout=60) == 0
    deadline = time.monotonic() + 20
    while any(os.path.exists(f"/proc/{p}") and "zombie" not in open(f"/proc/{p}/status").read().lower()
              for p in started):
        assert time.monotonic() < deadline, "a worker or etcd outlived its supervisor"
        time.sleep(0.1)


def _serve(data_dir: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pigeon", "serve", "--data-dir", data_dir, "--port", "0",
                           "--http-port", "0", *args], capture_output=True, text=True, timeout=60)


def test_a_data_directory_of_the_other_kind_is_refused(tmp_path):
    single = tmp_path / "single"
    (single / "wal").mkdir(parents=True)  # a single node's data
    out = _serve(str(single), "--workers", "2")
    assert out.returncode != 0 and "holds a single node's data" in out.stderr, out.stderr

    layout = tmp_path / "workers"
    layout.mkdir()
    (layout / "workers.json").write_text(json.dumps({"workers": 3, "etcd_client": 1, "etcd_peer": 2}))
    out = _serve(str(layout))
    assert out.returncode != 0 and "holds the data of 3 workers" in out.stderr, out.stderr
    out = _serve(str(layout), "--workers", "2")
    assert out.returncode != 0 and "--workers 3 or more" in out.stderr, out.stderr
    assert json.loads((layout / "workers.json").read_text())["workers"] == 3, "a refused start changes nothing"

    cluster = ["--etcd", "127.0.0.1:2379", "--advertise", "127.0.0.1:9"]
    out = _serve(str(layout), "--workers", "3", *cluster, "--node-id", "n1")
    assert out.returncode != 0 and "start it without --etcd" in out.stderr, out.stderr
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "workers.json").write_text(json.dumps({"workers": 2, "node_id": "n1"}))
    out = _serve(str(nodes), "--workers", "2", *cluster, "--node-id", "n2")
    assert out.returncode != 0 and "holds the data of node n1's workers" in out.stderr, out.stderr
    out = _serve(str(tmp_path / "x"), "--workers", "2", *cluster, "--node-id", "n1", "--auth-token-file", "t")
    assert out.returncode == 2 and "needs --tls-client-ca (the cluster's CA)" in out.stderr, out.stderr
    out = _serve(str(tmp_path / "y"), "--workers", "2", "--peer-port", "7001")
    assert out.returncode == 2 and "get peer ports of their own" in out.stderr, out.stderr
    out = _serve(str(tmp_path / "y"), "--workers", "2", "--peer-cert", "c.pem", "--peer-key", "k.pem")
    assert out.returncode == 2 and "get node certificates of their own" in out.stderr, out.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_secured_workers_prove_they_are_nodes_to_each_other_and_clients_meet_one_secured_port(tmp_path):
    """`--workers 2` with TLS and tokens: the official client (TLS, a bearer token) publishes to and streams from
    each worker's topic through the one port (the other worker's calls forwarded over mutual TLS with node
    certificates the supervisor made, and appends on TLS append channels); a caller without a token is refused."""
    from google.auth.credentials import AnonymousCredentials
    from google.api_core import exceptions
    from google.cloud import pubsub_v1
    from google.oauth2.credentials import Credentials
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport
    import grpc
    from tests.e2e.security_kit import Kit

    kit = Kit(str(tmp_path / "pki"))
    server = ServerProcess(str(tmp_path / "data"), extra=["--workers", "2", *kit.serve_args()])
    server.start(timeout=60)
    try:
        with open(tmp_path / "data" / "workers.json") as f:
            etcd = f"127.0.0.1:{json.load(f)['etcd_client']}"
        await_status(etcd, lambda st: st["unowned"] == 0 and sum(r["state"] == "up" and r["bundles"] > 0 for r in st["nodes"]) == 2
                     and st["ledgers"]["open"] >= st["bundles"], timeout=60, what="both workers to own bundles")
        host = server.address.replace("127.0.0.1", "localhost")  # the name the server certificate has
        tls = grpc.ssl_channel_credentials(kit.ca)
        token = Credentials(kit.admin_token)
        pub = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(host=host, credentials=token,
                                                                         ssl_channel_credentials=tls))
        sub = pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(host=host, credentials=token,
                                                                           ssl_channel_credentials=tls))
        owner_of = owners(etcd)
        for w in ("w0", "w1"):
            topic = topic_owned_by(owner_of, w, f"{P}/topics/sec-{w}")
            subscription = f"{P}/subscriptions/sec-{w}"
            pub.create_topic(name=topic)
            sub.create_subscription(name=subscription, topic=topic)
            sent = {pub.publish(topic, f"{w}-{i}".encode()).result(timeout=30): f"{w}-{i}" for i in range(50)}
            assert _streamed(sub, subscription, set(sent)).items() >= sent.items()
        anonymous = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(
            host=host, credentials=AnonymousCredentials(), ssl_channel_credentials=tls))
        with pytest.raises(exceptions.Unauthenticated):
            anonymous.create_topic(name=f"{P}/topics/nobody", timeout=10)
        pki = tmp_path / "data" / "pki"
        assert {p.name for p in pki.iterdir()} >= {"ca.pem", "node-w0.pem", "node-w1.pem"}
        with open(server.log_path, errors="replace") as f:
            text = f.read()
        assert text.count("(the append channel, mutual TLS)") == 2, "each worker's appends come over TLS"
        pub.stop()
        sub.close()
    finally:
        server.stop(timeout=60)


def test_workers_join_a_cluster_on_etcd_as_nodes_of_one_machine(etcd, tmp_path):
    """`--workers 2 --etcd …`: the workers are nodes n1.w0 and n1.w1 of the cluster beside single nodes n2 and n3;
    an ensemble holds one of n1's workers at most (copies on one machine's disk are one copy: three machines, so
    every ledger is on three of them), the official clients reach the topics of all four nodes through n1's
    one port, and a worker killed with SIGKILL loses nothing it acknowledged."""
    wipe(etcd.endpoint)
    machine = node_process(str(tmp_path), etcd.endpoint, "n1", extra=["--workers", "2"]).start(timeout=60)
    others = [node_process(str(tmp_path), etcd.endpoint, n).start() for n in ("n2", "n3")]
    try:
        nodes = {"n1.w0", "n1.w1", "n2", "n3"}
        await_status(etcd.endpoint, lambda st: st["unowned"] == 0 and {r["node"] for r in st["nodes"]
                                                                        if r["state"] == "up" and r["bundles"]} == nodes
                     and st["ledgers"]["open"] >= st["bundles"], timeout=60, what="four nodes to own bundles")
        shown = {r["node"]: r["machine"] for r in status(etcd.endpoint)["nodes"]}  # `pigeon cluster status`'s rows
        assert shown == {"n1.w0": "n1", "n1.w1": "n1", "n2": "", "n3": ""}, shown
        # a ledger opened while fewer machines were up has fewer members until the owner widens it (a roll)
        deadline = time.monotonic() + 30
        ensembles = open_ledgers(etcd.endpoint)
        while not all(len(m) == 3 for m in ensembles.values()):
            assert time.monotonic() < deadline, f"open ledgers not widened to three machines: {ensembles}"
            time.sleep(0.2)
            ensembles = open_ledgers(etcd.endpoint)
        assert ensembles and all(sum(n.startswith("n1.") for n in m) == 1 for m in ensembles.values()), ensembles
        assert _worker_pids(machine.proc.pid).keys() == {"n1.w0", "n1.w1"}

        owner_of = owners(etcd.endpoint)
        topics = {n: topic_owned_by(owner_of, n, f"{P}/topics/e-{n}") for n in sorted(nodes)}
        pub, sub = clients_of(machine)
        for n, topic in topics.items():
            pub.create_topic(name=topic)
            sub.create_subscription(name=f"{P}/subscriptions/e-{n}", topic=topic, ack_deadline_seconds=10)
        sent = {n: {pub.publish(t, f"{n}-{i}".encode()).result(timeout=30): f"{n}-{i}" for i in range(50)}
                for n, t in topics.items()}
        for n in topics:
            got = _streamed(sub, f"{P}/subscriptions/e-{n}", set(sent[n]))
            assert got.items() >= sent[n].items(), f"{len(set(sent[n]) - set(got))} of {n}'s messages not delivered"

        # kill -9 of a worker: its bundles move (or come back with it), and nothing it acknowledged is lost —
        # neither what it answered before the kill and nobody consumed yet, nor what is published after it
        topic = topics["n1.w0"]
        after = {pub.publish(topic, f"before-{i}".encode()).result(timeout=30): f"before-{i}" for i in range(50)}
        os.kill(_worker_pids(machine.proc.pid)["n1.w0"], signal.SIGKILL)
        deadline = time.monotonic() + 90
        for i in range(50):
            while True:
                try:
                    after[pub.publish(topic, f"after-{i}".encode()).result(timeout=30)] = f"after-{i}"
                    break
                except Exception:  # noqa: BLE001 — UNAVAILABLE while the bundle's owner changes: publish again
                    assert time.monotonic() < deadline, "publishing did not resume"
                    time.sleep(0.2)
        got = _streamed(sub, f"{P}/subscriptions/e-n1.w0", set(after))
        assert got.items() >= after.items(), f"{len(set(after) - set(got))} acknowledged publishes lost"
        assert not set(got) & set(sent["n1.w0"]), "a message acknowledged before the kill came back"
        pub.stop()
        sub.close()
    finally:
        machine.stop(timeout=60)
        for o in others:
            o.kill()


def test_workers_reach_each_other_on_the_peer_host(tmp_path):
    """`--workers 2 --peer-host 127.0.0.2`: each worker's peer port and append channel listen there only, and a
    call reaching the worker that does not own its topic is forwarded to the other over it."""
    import socket

    server = ServerProcess(str(tmp_path / "data"), extra=["--workers", "2", "--peer-host", "127.0.0.2"])
    server.start(timeout=60)
    try:
        with open(tmp_path / "data" / "workers.json") as f:
            etcd = f"127.0.0.1:{json.load(f)['etcd_client']}"
        await_status(etcd, lambda st: st["unowned"] == 0 and sum(r["state"] == "up" and r["bundles"] > 0 for r in st["nodes"]) == 2
                     and st["ledgers"]["open"] >= st["bundles"], timeout=60, what="both workers to own their bundles")
        for pid in _worker_pids(server.proc.pid).values():
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            for port in (int(env[b"PIGEON_PEER_PORT"]), int(env[b"PIGEON_APPEND_PORT"])):
                socket.create_connection(("127.0.0.2", port), timeout=5).close()
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
        owner_of = owners(etcd)
        pub, sub = clients_of(server)
        for w in ("w0", "w1"):  # one of the two calls reaches the other worker and is forwarded
            topic = topic_owned_by(owner_of, w, f"{P}/topics/peer-host-{w}")
            pub.create_topic(name=topic)
            sub.create_subscription(name=f"{P}/subscriptions/peer-host-{w}", topic=topic)
            sent = {pub.publish(topic, f"{w}-{i}".encode()).result(timeout=30): f"{w}-{i}" for i in range(20)}
            got = _streamed(sub, f"{P}/subscriptions/peer-host-{w}", set(sent))
            assert got.items() >= sent.items()
        pub.stop()
        sub.close()
    finally:
        server.stop(timeout=60)
