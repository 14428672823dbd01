"""A cluster node whose etcd is secured as in production — https client URLs, client certificates of etcd's CA
required (--client-cert-auth) — with a real `pigeon serve --etcd https://… --etcd-ca --etcd-cert --etcd-key` and
the official client: it joins, owns the bundles, publishes and delivers; `pigeon cluster status` reaches the same
etcd with the same options, and without a certificate is refused in one line. Settings that cannot work stop
`pigeon serve` and `pigeon cluster` before anything is dialled."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pigeon.bench.procs import free_port
from pigeon.testing.cluster import await_status, clients_of, node_process, wipe
from tests.e2e.e2e_helpers import E2E_MARKS, collect

pytestmark = E2E_MARKS
P = "projects/etcd-tls"


@pytest.fixture
def node(etcd_tls, tmp_path):
    """n1 alone (one replica, so it writes its ledgers without peers), reaching etcd with its node certificate."""
    wipe(etcd_tls.access())
    n = node_process(str(tmp_path), etcd_tls.url, "n1", extra=[*etcd_tls.tls_flags("node-n1"), "--replicas", "1",
                                                              "--ack-quorum", "1"]).start()
    yield n
    n.kill()


def cluster_status(etcd_tls, *tls: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pigeon", "cluster", "status", "--etcd", etcd_tls.url, *tls,
                           "-f", "json"], capture_output=True, text=True, timeout=30)


def test_a_node_on_a_tls_etcd_owns_bundles_serves_the_official_client_and_shows_in_cluster_status(node, etcd_tls):
    st = await_status(etcd_tls.access("client-ops"), lambda st: st["unowned"] == 0 and len(st["nodes"]) == 1,
                      timeout=15, what="n1 to own every bundle over TLS to etcd")
    assert [(r["node"], r["state"], r["bundles"]) for r in st["nodes"]] == [("n1", "up", st["bundles"])]

    pub, sub = clients_of(node)
    try:
        pub.create_topic(name=f"{P}/topics/orders")  # the metadata log: an etcd transaction over TLS
        sub.create_subscription(name=f"{P}/subscriptions/orders-sub", topic=f"{P}/topics/orders")
        sent = {pub.publish(f"{P}/topics/orders", f"m{i}".encode()).result(timeout=10) for i in range(20)}
        got = collect(sub, f"{P}/subscriptions/orders-sub", 20, timeout=10)
        assert set(got) == sent
        assert sorted(r.message.data for r in got.values()) == sorted(f"m{i}".encode() for i in range(20))
    finally:
        sub.close()
        pub.stop()

    out = cluster_status(etcd_tls, *etcd_tls.tls_flags("client-ops"))  # an operator's certificate, not a node's
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["cluster"] == st["cluster"] and shown["unowned"] == 0
    from pigeon.storage import formats
    from pigeon.version import __version__

    cores = shown["nodes"][0].pop("cores")  # (none until the node's first load report)
    assert cores is None or cores >= 0
    assert shown["nodes"] == [{"node": "n1", "address": node.address, "zone": "", "machine": "", "state": "up",
                               "bundles": st["bundles"], "version": __version__, "format": formats.CLUSTER}]

    out = cluster_status(etcd_tls, "--etcd-ca", etcd_tls.pki_file("ca"))  # no client certificate: etcd refuses
    assert out.returncode == 3 and out.stdout == ""
    ours = [line for line in out.stderr.splitlines() if line.startswith("pigeon: ")]  # besides gRPC's own log
    assert len(ours) == 1 and ours[0].startswith(f"pigeon: etcd cannot be reached at {etcd_tls.endpoint} over TLS: ")
    assert "etcd likely refused this client's certificate" in ours[0]


def test_etcd_tls_settings_that_cannot_work_stop_serve_and_cluster_in_one_line(tmp_path):
    def pigeon(*args) -> tuple[int, str]:
        out = subprocess.run([sys.executable, "-m", "pigeon", *args], capture_output=True, text=True, timeout=30)
        return out.returncode, out.stderr.strip().splitlines()[-1]

    serve = ["serve", "--port", str(free_port()), "--http-port", "0", "--data-dir", str(tmp_path / "d"),
             "--node-id", "n1"]
    assert pigeon(*serve, "--etcd", "http://127.0.0.1:2379", "--etcd-ca", "ca.pem") == (
        2, "pigeon: --etcd-ca is for TLS to etcd, but its endpoints say http:// (http://127.0.0.1:2379): give "
           "https:// endpoints (etcd's --listen-client-urls https://…)")
    assert pigeon(*serve, "--etcd", "https://127.0.0.1:2379", "--etcd-cert", "n1.pem") == (
        2, "pigeon: --etcd-cert and --etcd-key go together (this node's client certificate for etcd and its key)")
    missing = str(tmp_path / "missing.pem")
    assert pigeon(*serve, "--etcd", "https://127.0.0.1:2379", "--etcd-ca", missing) == (
        1, f"pigeon: --etcd-ca {missing}: No such file or directory")  # read at start, before etcd is dialled
    assert pigeon("cluster", "status", "--etcd", "http://127.0.0.1:2379", "--etcd-cert", "c.pem", "--etcd-key",
                  "k.pem") == (2, "pigeon: --etcd-cert and --etcd-key are for TLS to etcd, but its endpoints say "
                                  "http:// (http://127.0.0.1:2379): give https:// endpoints (etcd's "
                                  "--listen-client-urls https://…)")
